"""source="file": resolved pages come from a snapshot file (make_snapshot),
read with pread or from an mmap of it, with its page cache cold or warm,
and every page is verified against the file's bytes."""
from __future__ import annotations

import hashlib
import os
import threading

import numpy as np
import pytest
from helpers.hostfacts import NO_UFFD_MOVE, facts_for_run, host_skip
from helpers.resources import assert_released, resources
from helpers.runs import run_or_skip, run_with_fault

import uffdkvm
from uffdkvm import ConfigError, HostUnsupportedError
from uffdkvm.config import BACKING_PAGE_SIZES

pytestmark = pytest.mark.kvm

PAGE = 4096
VCPUS = 2
MEM = 4 << 20                     # per vCPU: 2 huge pages of 2 MiB, 1024 of 4 KiB
REGION = VCPUS * MEM
SYNTHETIC_WORD3 = 0xa5c3a5c3a5c3a5c3 ^ 3   # csrc/uffd/fill.h UKVM_FILL_WORD(3)


def file_run(snapshot, **fields):
    return run_or_skip(**{"vcpus": VCPUS, "mem_per_vcpu": MEM, "source": "file",
                          "source_path": snapshot, **fields})


def assert_from_file(r):
    """The core ran the file source and fetched one page per fault message."""
    assert r.verified, r.verify_message
    assert r.source == "file"
    messages = sum(x.faults + x.eexist for x in r.readers)
    assert r.faults == REGION // r.page_size
    assert r.source_bytes == messages * r.page_size
    for x in r.readers:
        assert x.source_seconds is not None and (x.source_seconds > 0) == (x.source_bytes > 0)


def proc_io():
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}


def words(path):
    return np.fromfile(path, dtype=np.uint64)


# ---- make_snapshot ----

def test_make_snapshot_pages_differ_from_each_other_and_from_the_synthetic_fill(tmp_path):
    path = uffdkvm.make_snapshot(tmp_path / "a.img", "1M", seed=3)
    assert isinstance(path, str) and os.path.getsize(path) == 1 << 20
    w = words(path).reshape(-1, PAGE // 8)
    digests = {hashlib.sha1(page.tobytes()).digest() for page in w}
    assert len(digests) == len(w), "two pages of the snapshot are the same"
    assert not np.any(w[:, 3] == SYNTHETIC_WORD3)
    # Seeded: the same seed again gives the same bytes, another seed others.
    same = words(uffdkvm.make_snapshot(tmp_path / "b.img", "1M", seed=3))
    other = words(uffdkvm.make_snapshot(tmp_path / "c.img", "1M", seed=4))
    assert np.array_equal(same, w.ravel())
    assert np.count_nonzero(other == w.ravel()) < 4


@pytest.mark.parametrize("size,fix", [(4097, "whole number of 4 KiB pages"), (0, "at least one"),
                                      ("64Q", "e.g. '64M'")])
def test_make_snapshot_refuses_a_bad_size(tmp_path, size, fix):
    with pytest.raises(ConfigError, match="size: ") as info:
        uffdkvm.make_snapshot(tmp_path / "x.img", size)
    assert fix in str(info.value)
    assert not (tmp_path / "x.img").exists()


def test_make_snapshot_into_a_missing_directory_is_a_host_error(tmp_path):
    with pytest.raises(HostUnsupportedError, match="open"):
        uffdkvm.make_snapshot(tmp_path / "no" / "x.img", "64K")


# ---- runs ----

@pytest.mark.parametrize("resolver", ["readers", "vcpu"])
@pytest.mark.parametrize("backing", ["anonymous", "anonymous_thp", "shmem", "anonymous_hugetlb",
                                     "shared_hugetlb"])
def test_every_page_holds_the_files_bytes(kvm, hugepages, snapshot, backing, resolver):
    # Half the pages read (the guest's checksum of word 1 against the
    # file's), half written (word 0 and the count in word 2 over the file's).
    r = file_run(snapshot, backing=backing, resolver=resolver, write_percent=50)
    assert_from_file(r)
    assert r.page_size == BACKING_PAGE_SIZES[backing]


@pytest.mark.parametrize("resolver", ["readers", "vcpu"])
@pytest.mark.parametrize("backing", ["anonymous", "anonymous_thp"])
def test_move_installs_the_files_bytes(kvm, snapshot, backing, resolver):
    if NO_UFFD_MOVE.holds:
        host_skip(NO_UFFD_MOVE, f"resolve='move': {NO_UFFD_MOVE.evidence}")
    r = file_run(snapshot, backing=backing, resolver=resolver, resolve="move", write_percent=50)
    assert_from_file(r)
    assert all(x.moves == x.faults + x.eexist and x.copies == 0 for x in r.readers)


def test_overlapping_vcpus_and_several_readers_get_the_files_bytes(kvm, snapshot):
    # Every vCPU walks the one region: pages raced for (EEXIST) are fetched too.
    r = run_or_skip(vcpus=VCPUS, mem_per_vcpu=REGION, overlap=True, readers=3,
                    source="file", source_path=snapshot, write_percent=30, pattern="random")
    assert r.verified and r.source == "file"
    assert r.source_bytes == sum(x.faults + x.eexist for x in r.readers) * PAGE


def test_a_1g_page_comes_from_the_file(kvm, hugepages, tmp_path):
    """One fault copies the whole 1 GiB from the file, and verification
    reads all of it; the guest touches 1% of its 4 KiB pages (all 262,144
    take some 10 s where the guest is emulated)."""
    path = uffdkvm.make_snapshot(tmp_path / "1g.img", "1G", seed=1)
    r = run_or_skip(vcpus=1, mem_per_vcpu="1G", backing="anonymous_hugetlb_1gb",
                    source="file", source_path=path, write_percent=50, touch_percent=1)
    assert r.verified and r.source == "file" and r.source_bytes == 1 << 30


@pytest.mark.parametrize("how", ["pread", "mmap"])
def test_source_read_is_pread_or_a_copy_from_the_mapping(kvm, snapshot, how):
    """pread(2) counts in the process's read characters (/proc/self/io
    rchar); a memcpy from the mapping does not. Cold, so that warming does
    not read the file too."""
    before = proc_io()
    r = file_run(snapshot, source_read=how, source_cache="cold")
    read = proc_io()["rchar"] - before["rchar"]
    assert_from_file(r)
    if how == "pread":
        assert read >= REGION, read
    else:
        assert read < REGION // 4, read


def test_cold_drops_the_page_cache_before_the_vcpus_start(kvm, snapshot):
    with open(snapshot, "rb") as f:  # every page cached first, by us
        while f.read(1 << 20):
            pass
    before = proc_io()
    r = file_run(snapshot, source_cache="cold")
    assert_from_file(r)
    assert r.source_cached_pages_at_start == 0
    # The faults read the file from the disk (the storage layer's own count).
    assert proc_io()["read_bytes"] - before["read_bytes"] >= REGION


def test_warm_reads_the_file_into_the_page_cache_first(kvm, snapshot):
    fd = os.open(snapshot, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # nothing cached, by us
    finally:
        os.close(fd)
    r = file_run(snapshot, source_cache="warm")
    assert_from_file(r)
    assert r.source_cached_pages_at_start == REGION // PAGE
    # Once warm, a second run's faults find every page cached: no disk reads.
    before = proc_io()
    again = file_run(snapshot, source_cache="warm")
    assert again.source_cached_pages_at_start == REGION // PAGE
    assert proc_io()["read_bytes"] - before["read_bytes"] < REGION // 4


def test_the_synthetic_source_reports_itself_and_times_nothing(kvm):
    r = run_or_skip(vcpus=VCPUS, mem_per_vcpu=MEM)
    assert r.source == "synthetic" and r.source_cached_pages_at_start is None
    assert r.source_bytes == REGION and r.source_seconds is None


def test_stats_basic_counts_bytes_but_times_nothing(kvm, snapshot):
    r = file_run(snapshot, stats="basic")
    assert r.verified and r.source_bytes == REGION and r.source_seconds is None


def test_a_result_with_a_file_source_survives_json(kvm, snapshot):
    r = file_run(snapshot)
    back = uffdkvm.Result.from_json(r.to_json())
    assert back == r
    assert back.source == "file" and back.source_cached_pages_at_start == REGION // PAGE
    assert back.readers[0].source_bytes == r.readers[0].source_bytes


# ---- verification fails when a page comes from the wrong place ----

@pytest.mark.parametrize("write_percent", [0, 100])
def test_a_page_fetched_from_the_wrong_offset_fails_verification(kvm, snapshot, write_percent):
    after = 5
    r = run_with_fault(vcpus=VCPUS, mem_per_vcpu=MEM, source="file", source_path=snapshot,
                       write_percent=write_percent, trace_faults=True,
                       fault="source_wrong_offset", after=after)
    assert not r.verified and r.bad_pages == 1
    region_gpa = min(r.fault_trace.gpa)
    assert f"page at gpa 0x{region_gpa + after * PAGE:x}:" in r.verify_message, \
        r.verify_message
    assert "the source file's bytes" in r.verify_message


def test_a_huge_page_fetched_from_the_wrong_offset_fails_whole(kvm, snapshot):
    r = run_with_fault(vcpus=VCPUS, mem_per_vcpu=MEM, backing="anonymous_thp", source="file",
                       source_path=snapshot, trace_faults=True, fault="source_wrong_offset",
                       after=3)
    assert not r.verified and r.bad_pages == (2 << 20) // PAGE
    # Page 3 is in the first huge page, which came whole from the second's place.
    assert f"page at gpa 0x{min(r.fault_trace.gpa):x}:" in r.verify_message, r.verify_message


# ---- errors ----

def test_a_missing_file_names_source_path_and_make_snapshot(kvm, tmp_path, released):
    for call in (uffdkvm.run, uffdkvm.probe):
        with pytest.raises(ConfigError) as info:
            call(vcpus=VCPUS, mem_per_vcpu=MEM, source="file", source_path=tmp_path / "none")
        assert info.value.field == "source_path"
        assert "does not exist" in str(info.value) and "make_snapshot" in str(info.value)


def test_a_short_file_names_both_sizes(kvm, tmp_path, released):
    short = uffdkvm.make_snapshot(tmp_path / "short.img", REGION - PAGE)
    with pytest.raises(ConfigError) as info:
        uffdkvm.run(vcpus=VCPUS, mem_per_vcpu=MEM, source="file", source_path=short)
    message = str(info.value)
    assert info.value.field == "source_path"
    assert f"{REGION - PAGE} bytes" in message and f"({REGION} bytes)" in message
    assert f"make_snapshot(path, {REGION})" in message


def test_a_directory_is_not_a_snapshot(kvm, tmp_path, released):
    with pytest.raises(ConfigError, match="source_path: .* not a regular file"):
        uffdkvm.run(vcpus=VCPUS, mem_per_vcpu=MEM, source="file", source_path=tmp_path)


def test_a_larger_file_serves_its_first_bytes(kvm, snapshot):
    """Only the region's size of the file is used: its start."""
    r = run_or_skip(vcpus=1, mem_per_vcpu=MEM, source="file", source_path=snapshot)
    assert r.verified and r.source_bytes == MEM


@pytest.mark.parametrize("fields,why", [
    (dict(resolve="zeropage"), "resolve='zeropage'"),
    (dict(uffd_mode="minor", backing="shmem"), "uffd_mode='minor'"),
    (dict(uffd_mode="wp"), "uffd_mode='wp'"),
    (dict(uffd_mode=None), "uffd_mode=None"),
    (dict(prefault=True), "prefault=True"),
])
def test_a_source_where_nothing_is_fetched_is_refused(fields, why):
    with pytest.raises(ConfigError) as info:
        uffdkvm.Config(source="file", source_path="/var/tmp/x.img", **fields)
    assert info.value.field == "source"
    assert "uffd_mode='missing' with resolve='copy' or 'move'" in str(info.value)
    assert why in str(info.value)


@pytest.mark.parametrize("fields,fix", [
    (dict(resolve=uffdkvm._core.RESOLVE_ZEROPAGE), "source: 'file' supplies the data of missing faults"),
    (dict(source=uffdkvm._core.SOURCE_REMOTE), "source_address: source='remote' needs"),
    (dict(source_address="unix:/x"), "source_address: applies to source='remote' only"),
    (dict(source=uffdkvm._core.SOURCE_SYNTHETIC, source_path="/x"),
     "source_path: applies to source='file' or source='remote' only"),
    (dict(source=uffdkvm._core.SOURCE_REMOTE, source_address="unix:/x",
          source_cache=uffdkvm._core.SOURCE_CACHE_COLD),
     "source_cache: applies to source='file' only"),
    (dict(source_path=""), "source_path: source='file' needs"),
])
def test_the_core_refuses_a_bad_source_on_its_own(kvm, snapshot, fields, fix):
    """The C core's own guard, for callers that skip Config."""
    from uffdkvm.config import core_config
    raw = {**core_config(uffdkvm.Config(vcpus=1, mem_per_vcpu="64K", source="file",
                                         source_path=snapshot)), **fields}
    with pytest.raises(uffdkvm._core.CoreError) as info:
        uffdkvm._core.run(raw)
    kind, _, message = info.value.args
    assert kind == uffdkvm._core.ERR_CONFIG and message.startswith(fix), message


def test_a_failed_source_leaves_nothing_behind(kvm, tmp_path):
    before = resources()
    short = uffdkvm.make_snapshot(tmp_path / "short.img", PAGE)
    for _ in range(3):
        with pytest.raises(ConfigError):
            uffdkvm.run(vcpus=VCPUS, mem_per_vcpu=MEM, source="file", source_path=short)
    assert_released(before, maps_slack=2)


def test_the_cli_runs_a_file_source_and_says_what_it_cost(kvm, snapshot, capsys):
    from uffdkvm.cli import main
    status = main(["-v", str(VCPUS), "-b", str(MEM), "-q", "--source", "file",
                   "--source-path", snapshot, "--source-read", "mmap", "--source-cache", "cold"])
    out, err = capsys.readouterr()
    if status == 4:  # kselftest's skip: this host cannot
        host_skip(facts_for_run(source="file", source_cache="cold"), err)
    assert status == 0, out + err
    assert f"Page source:\tfile {snapshot} (mmap, cache cold: 0 pages cached at start), " \
           f"{REGION} bytes fetched in " in out
    status = main(["-v", str(VCPUS), "-b", str(MEM), "-q", "--json", "--source", "file",
                   "--source-path", snapshot])
    r = uffdkvm.Result.from_json(capsys.readouterr().out)
    assert status == 0 and r.source == "file" and r.config.source_path == snapshot


def test_cold_is_checked_and_a_file_that_stays_cached_is_refused(kvm, released):
    """A tmpfs file has no disk to drop its pages to: mincore() finds them
    still cached, and cold is refused rather than run warm."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    path = uffdkvm.make_snapshot(f"/dev/shm/uffdkvm-test-{os.getpid()}.img", REGION)
    try:
        with pytest.raises(HostUnsupportedError) as info:
            uffdkvm.run(vcpus=VCPUS, mem_per_vcpu=MEM, source="file", source_path=path,
                        source_cache="cold")
        message = str(info.value)
        assert f"{REGION // PAGE} of {REGION // PAGE} pages" in message, message
        assert "stayed in the page cache" in message and "source_cache warm" in message
        # Warm it runs: the pages are there.
        r = run_or_skip(vcpus=VCPUS, mem_per_vcpu=MEM, source="file", source_path=path)
        assert r.verified and r.source_cached_pages_at_start == REGION // PAGE
    finally:
        os.unlink(path)


def test_runs_with_a_file_give_back_every_fd_thread_and_mapping(kvm, snapshot):
    def runs():
        for how in ("pread", "mmap"):
            assert file_run(snapshot, source_read=how, resolver="vcpu").verified
            assert file_run(snapshot, source_read=how, readers=2).verified
        with pytest.raises(uffdkvm.RunError):  # a failed run too
            run_with_fault(vcpus=VCPUS, mem_per_vcpu=MEM, source="file",
                           source_path=snapshot, fault="resolve_eio", after=10)
    runs()  # glibc's per-thread arenas and cached stacks come once, and stay
    before = resources()
    runs()
    assert_released(before, maps_slack=1)


def test_a_file_cut_short_during_the_run_is_a_run_error_naming_it(kvm, tmp_path):
    """pread(2) past the end returns nothing: the fetch fails with EIO and the
    run says which file ended early, at what offset."""
    path = uffdkvm.make_snapshot(tmp_path / "cut.img", REGION)
    cutter = threading.Timer(0.3, os.truncate, (path, PAGE))
    cutter.start()
    try:
        with pytest.raises(uffdkvm.RunError) as info:
            # 1 ms a fault, 2048 faults: the cut comes early in the run.
            uffdkvm.run(vcpus=VCPUS, mem_per_vcpu=MEM, source="file", source_path=path,
                        delay_us=1000)
    finally:
        cutter.join()
    message = str(info.value)
    assert f"of source_path {path}" in message and "ended early" in message, message
