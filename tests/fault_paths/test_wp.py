"""uffd_mode="wp": write-protect faults, QEMU's background snapshot.

The region is filled with known bytes and write-protected before the vCPUs
start; the guest's first write to each page faults, and the resolver saves
the page's old bytes into the snapshot and un-protects it. The run verifies
the guest's new bytes, that pages only read still hold the old ones, and
that each written page's snapshot slot holds its old bytes (and nothing was
saved for the rest). What the kernel saw is checked against a record the
WP code did not make: a MISSING run of the same seed, whose trace carries
the kernel's own write flag for every page.
"""
from __future__ import annotations

import pytest
from helpers.evidence import Trace
from helpers.hostfacts import facts_for_run, host_skip
from helpers.runs import run_or_skip, run_with_fault

import uffdkvm
from uffdkvm import Config, ConfigError, Result
from uffdkvm.cli import main as cli_main

pytestmark = pytest.mark.kvm

PAGES = 256  # 1 MiB per vCPU


def _wp(**fields) -> Result:
    fields = {"vcpus": 2, "mem_per_vcpu": "1M", "uffd_mode": "wp", **fields}
    return run_or_skip(**fields)


def _unprotected_every_message(r: Result) -> None:
    for x in r.readers:
        assert x.unprotects == x.faults + x.eexist, x
        assert x.copies == x.zeropages == x.continues == 0, x


@pytest.mark.parametrize("fields", [
    dict(),
    dict(backing="shmem"),
    dict(readers=3),
    dict(single_uffd=True, readers=2, wait="poll"),
], ids=["anonymous", "shmem", "3-readers", "single-uffd-poll"])
def test_every_page_written_faults_once_and_verifies(kvm, fields):
    r = _wp(**fields)
    assert r.verified, r.verify_message
    assert r.faults == 2 * PAGES
    assert r.eexist == 0
    assert sum(v.faults for v in r.vcpus) == r.faults  # each vCPU's own writes
    _unprotected_every_message(r)


def _written_by_the_kernels_flag(backing: str, seed: int) -> set[int]:
    """The pages a MISSING run of the same walk saw written: the kernel's
    UFFD_PAGEFAULT_FLAG_WRITE in its trace, a record the WP code never made."""
    missing = run_or_skip(vcpus=2, mem_per_vcpu="1M", backing=backing, write_percent=50,
                          seed=seed, trace_faults=True)
    t = Trace(missing.fault_trace)
    return set(t.gpa[t.write].tolist())


@pytest.mark.parametrize("backing", ["anonymous", "shmem"])
def test_only_the_pages_the_kernel_saw_written_fault(kvm, backing):
    """write_percent=50: the pages that WP-faulted are exactly the pages a
    MISSING run of the same seed saw written (the kernel's write flag), and
    no page only read faulted."""
    seed = 7
    wp = _wp(backing=backing, write_percent=50, seed=seed, trace_faults=True)
    t_wp = Trace(wp.fault_trace)
    written = _written_by_the_kernels_flag(backing, seed)
    assert 0 < len(written) < 2 * PAGES
    assert wp.faults == len(written)
    assert set(t_wp.gpa.tolist()) == written
    assert t_wp.write.all()  # a WP fault is a write
    _unprotected_every_message(wp)


def test_reads_never_fault(kvm):
    r = _wp(write_percent=0)
    assert r.verified, r.verify_message
    assert r.faults == 0 and all(x.unprotects == 0 for x in r.readers)


def test_later_passes_and_writes_by_two_vcpus_fault_once_per_page(kvm):
    r = _wp(passes=2)
    assert r.verified, r.verify_message
    assert r.faults == 2 * PAGES  # the second pass writes unprotected pages
    both = _wp(overlap=True, readers=2)
    assert both.verified, both.verify_message
    # one save per page; the other vCPU's message for it is an EEXIST
    assert both.faults == PAGES
    _unprotected_every_message(both)


def test_resolver_vcpu_saves_and_unprotects_on_the_vcpu_thread(kvm):
    """With UFFD_FEATURE_SIGBUS the WP fault comes back to KVM_RUN too."""
    r = _wp(resolver="vcpu", write_percent=50)
    assert r.verified, r.verify_message
    assert 0 < r.faults < 2 * PAGES
    for v in r.vcpus:
        assert v.fault_exits == v.faults > 0
    _unprotected_every_message(r)


def test_a_save_left_out_fails_verification_on_the_snapshot(kvm):
    """The same run with the resolver's copy into the snapshot left out
    (test hook): the guest's bytes are all there, the snapshot is not."""
    r = run_with_fault(Config(vcpus=2, mem_per_vcpu="1M", uffd_mode="wp"), "wp_no_save")
    assert not r.verified
    assert r.bad_pages == 2 * PAGES
    assert "snapshot slot" in r.verify_message
    assert "before the guest's write" in r.verify_message


def test_a_kernel_without_uffd_wp_is_a_host_error_naming_the_feature(kvm):
    with pytest.raises(uffdkvm.HostUnsupportedError, match="PAGEFAULT_FLAG_WP"):
        run_with_fault(Config(mem_per_vcpu="1M", uffd_mode="wp"), "no_wp_features")
    with pytest.raises(uffdkvm.HostUnsupportedError, match="WP_HUGETLBFS_SHMEM"):
        run_with_fault(Config(mem_per_vcpu="1M", uffd_mode="wp", backing="shmem"),
                       "no_wp_features")


@pytest.mark.parametrize("backing", ["anonymous_thp", "anonymous_hugetlb", "shared_hugetlb",
                                     "guest_memfd"])
def test_other_backings_are_refused_naming_the_field(backing):
    with pytest.raises(ConfigError, match="'wp' runs on 'anonymous' or 'shmem'") as info:
        Config(mem_per_vcpu="2M", uffd_mode="wp", backing=backing)
    assert info.value.field == "uffd_mode"


def test_zeropage_is_refused(kvm):
    with pytest.raises(ConfigError, match="zeropage"):
        Config(uffd_mode="wp", resolve="zeropage")


def test_the_core_refuses_a_huge_backing_too(kvm):
    """The C core's own guard, past Python's validation."""
    from uffdkvm import _core
    from uffdkvm.run import _config_of, _run
    c = _config_of(None, {"mem_per_vcpu": "2M", "uffd_mode": "wp"})
    object.__setattr__(c, "backing", "anonymous_thp")
    with pytest.raises(ConfigError, match="runs on 'anonymous' or 'shmem' memory"):
        _run(c)
    assert _core.UFFD_WP != _core.UFFD_MINOR


def test_unprotects_reach_json_and_frames(kvm):
    r = _wp()
    back = Result.from_json(r.to_json())
    assert [x.unprotects for x in back.readers] == [x.unprotects for x in r.readers]
    assert sum(x.unprotects for x in r.readers) == 2 * PAGES
    df = r.readers_frame()
    assert list(df["unprotects"]) == [x.unprotects for x in r.readers]


def test_cli_takes_u_wp(kvm, capsys):
    assert cli_main(["-u", "WP", "-v", "2", "-b", "1M", "--json"]) == 0
    r = Result.from_json(capsys.readouterr().out)
    assert r.config.uffd_mode == "wp"
    assert r.verified and r.faults == 2 * PAGES
    assert sum(x.unprotects for x in r.readers) == 2 * PAGES


def test_memory_check_counts_the_snapshot(monkeypatch):
    """run() refuses a region whose snapshot would not fit beside it."""
    import sys
    run_mod = sys.modules["uffdkvm.run"]
    region = 64 << 20
    monkeypatch.setattr(run_mod, "_mem_available", lambda: region + region // 2)
    c = Config(mem_per_vcpu=region, uffd_mode="wp")
    with pytest.raises(uffdkvm.HostUnsupportedError, match="snapshot"):
        run_mod._check_fits_host(c)
    run_mod._check_fits_host(Config(mem_per_vcpu=region, uffd_mode="missing"))


# ---- wp_async: UFFD_FEATURE_WP_ASYNC and PAGEMAP_SCAN ----

@pytest.mark.parametrize("backing", ["anonymous", "shmem"])
def test_async_delivers_no_faults_and_finds_exactly_the_pages_written(kvm, backing):
    """No message reaches a reader; PAGEMAP_SCAN finds as many pages written
    as the guest wrote (verification checks it page by page)."""
    r = _wp(backing=backing, wp_async=True, write_percent=50, seed=7)
    assert r.verified, r.verify_message
    assert r.faults == r.eexist == 0
    assert all(x.unprotects == 0 and x.wakeups == 0 for x in r.readers)
    assert r.dirty_pages == len(_written_by_the_kernels_flag(backing, 7))
    every = _wp(backing=backing, wp_async=True)
    assert every.verified and every.dirty_pages == 2 * PAGES
    none = _wp(backing=backing, wp_async=True, write_percent=0)
    assert none.verified and none.dirty_pages == 0
    assert _wp(backing=backing).dirty_pages is None  # synchronous: no scan


def test_async_survives_json(kvm):
    r = _wp(wp_async=True, write_percent=50)
    back = Result.from_json(r.to_json())
    assert back.config.wp_async and back.dirty_pages == r.dirty_pages


def test_async_refusals_name_the_field():
    with pytest.raises(ConfigError, match="uffd_mode='wp' only") as info:
        Config(wp_async=True)
    assert info.value.field == "wp_async"
    with pytest.raises(ConfigError, match="resolver='vcpu'") as info:
        Config(uffd_mode="wp", wp_async=True, resolver="vcpu")
    assert info.value.field == "wp_async"


def test_a_kernel_without_wp_async_is_a_host_error(kvm):
    with pytest.raises(uffdkvm.HostUnsupportedError, match="WP_ASYNC"):
        run_with_fault(Config(mem_per_vcpu="1M", uffd_mode="wp", wp_async=True),
                       "no_wp_features")


def test_cli_wp_async(kvm, capsys):
    status = cli_main(["-u", "WP", "--wp-async", "-v", "2", "-b", "1M", "--json"])
    out, err = capsys.readouterr()
    if status == 4:  # kselftest's skip: this host cannot
        host_skip(facts_for_run(uffd_mode="wp", wp_async=True), err)
    assert status == 0, err
    r = Result.from_json(out)
    assert r.config.wp_async and r.verified and r.dirty_pages == 2 * PAGES
