"""resolve="move": MISSING faults resolved with UFFDIO_MOVE of a page the
resolver staged itself (Linux 6.8+, private anonymous memory)."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

import uffdkvm
from helpers.children import ENV as CHILD_ENV
from helpers.children import uffdkvm_command
from helpers.hostfacts import NO_UFFD_MOVE, facts_for_run, host_skip
from helpers.runs import run_or_skip, run_with_fault
from uffdkvm import ConfigError, HostUnsupportedError
from uffdkvm.config import RESOLVES

pytestmark = pytest.mark.kvm

PAGE = 4096


def needs_move():
    __tracebackhide__ = True
    if NO_UFFD_MOVE.holds:
        host_skip(NO_UFFD_MOVE, f"resolve='move': {NO_UFFD_MOVE.evidence}")


def assert_moved(r):
    """Every message of every resolver went through UFFDIO_MOVE, and only
    through it: a run that copied instead has copies, not moves."""
    for x in r.readers:
        assert x.moves == x.faults + x.eexist, x
        assert x.copies == x.zeropages == x.continues == 0, x


# 1 MiB per vCPU is 256 pages: several refills of each resolver's staging
# area (64 pages of 4 KiB), so a refill that left a page out fails to move.
@pytest.mark.parametrize("fields", [
    dict(vcpus=2, readers=2),
    dict(vcpus=2, single_uffd=True, readers=3, pattern="random"),
    dict(vcpus=2, resolver="vcpu"),
    dict(vcpus=2, resolver="vcpu", single_uffd=True),
    dict(vcpus=3, overlap=True, readers=3),
], ids=["per-vcpu-uffds", "one-uffd", "resolver-vcpu", "resolver-vcpu-one-uffd", "overlap"])
@pytest.mark.parametrize("write_percent", [0, 50, 100])
def test_move_verifies_every_page(kvm, fields, write_percent):
    needs_move()
    fields = {"write_percent": write_percent, **fields}
    r = run_or_skip(resolve="move", mem_per_vcpu="1M", **fields)
    assert r.bad_pages == 0
    assert_moved(r)
    pages = r.config.region_bytes // PAGE
    assert sum(x.faults for x in r.readers) == pages
    # Each vCPU's walk faulted every page it touched first (overlap: the
    # others found it resolved, or raced for it and met EEXIST).
    assert sum(x.moves for x in r.readers) >= pages


def test_move_on_thp_resolves_2mib_pages(kvm):
    needs_move()
    r = run_or_skip(resolve="move", backing="anonymous_thp", vcpus=2, mem_per_vcpu="8M",
                    readers=2, write_percent=50)
    assert_moved(r)
    assert r.page_size == 2 << 20
    assert sum(x.faults for x in r.readers) == 2 * 4


def anon_huge_kib():
    with open("/proc/self/smaps") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:"))


def test_move_on_thp_installs_each_huge_page_whole(kvm):
    """A staged 2 MiB page moves as one huge page (UFFDIO_COPY would map 512
    small ones): while the vCPU, done with its walk, stays 0.6 s before it
    leaves (vcpu_stall), the region is mapped and the kernel's own count of
    this process's huge anonymous memory (/proc/self/smaps) holds it all. A
    reader's staging area adds 2 MiB at most, so reaching the region's 16 MiB
    takes at least 7 of its 8 pages mapped huge."""
    needs_move()
    base = anon_huge_kib()
    seen = []
    done = threading.Event()

    def sample():
        while not done.is_set():
            seen.append(anon_huge_kib() - base)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    fields = dict(resolve="move", vcpus=1, backing="anonymous_thp", mem_per_vcpu="16M",
                  readers=1)
    try:
        r = run_with_fault(fault="vcpu_stall", after=600, **fields)
    except HostUnsupportedError as e:
        host_skip(facts_for_run(**fields), f"this host cannot: {e}")
    finally:
        done.set()
        sampler.join()
    assert r.verified, r.verify_message
    assert_moved(r)
    assert max(seen) >= 16 << 10, seen


@pytest.mark.parametrize("backing,mode", [
    ("shmem", "missing"), ("anonymous_hugetlb", "missing"),
    ("anonymous_hugetlb_1gb", "missing"), ("shared_hugetlb", "missing"),
    ("guest_memfd", "missing"), ("shmem", "minor"), ("anonymous", None),
])
def test_move_is_refused_where_it_cannot_move(backing, mode):
    with pytest.raises(ConfigError) as e:
        uffdkvm.Config(resolve="move", backing=backing, uffd_mode=mode,
                       mem_per_vcpu="1G" if backing.endswith("1gb") else "2M")
    assert e.value.field == "resolve"
    assert "resolve" in str(e.value) and "'move'" in str(e.value)


def test_a_kernel_without_move_is_a_host_error_naming_it(kvm):
    with pytest.raises(HostUnsupportedError, match=r"UFFDIO_MOVE.*6\.8"):
        run_with_fault(fault="no_move", resolve="move", vcpus=1, mem_per_vcpu="64K")


def test_the_kernel_decides(kvm):
    # Where the kernel has UFFDIO_MOVE a run goes through; where it has not,
    # the refusal is a HostUnsupportedError, never a failed run.
    try:
        r = uffdkvm.run(resolve="move", vcpus=1, mem_per_vcpu="64K")
    except HostUnsupportedError as e:
        assert NO_UFFD_MOVE.holds, f"refused on a kernel with UFFD_FEATURE_MOVE: {e}"
        assert "UFFDIO_MOVE" in str(e)
        return
    assert not NO_UFFD_MOVE.holds
    assert r.verified, r.verify_message
    support = uffdkvm.fault_path_support()["resolve"]
    assert set(support) == set(RESOLVES)
    assert support["move"] is None and support["copy"] is None


def test_moves_reach_json_and_frames_and_old_json_reads_zero(kvm):
    needs_move()
    pytest.importorskip("pandas")
    r = run_or_skip(resolve="move", vcpus=1, mem_per_vcpu="256K", readers=2)
    back = uffdkvm.Result.from_json(r.to_json())
    assert [x.moves for x in back.readers] == [x.moves for x in r.readers]
    assert sum(x.moves for x in back.readers) == 64
    from uffdkvm.io.frames import readers_frame
    assert readers_frame(r)["moves"].sum() == 64
    old = json.loads(r.to_json())
    for x in old["readers"]:
        del x["moves"]
    assert all(x.moves == 0 for x in uffdkvm.Result.from_json(json.dumps(old)).readers)


def test_the_cli_takes_resolve_move(kvm):
    needs_move()
    p = subprocess.run(uffdkvm_command("--resolve", "move", "-v", "1", "-b", "256K", "--json"),
                       capture_output=True, text=True,
                       timeout=120, env=CHILD_ENV)
    assert p.returncode == 0, p.stderr
    r = uffdkvm.Result.from_json(p.stdout)
    assert r.config.resolve == "move" and r.verified
    assert sum(x.moves for x in r.readers) == 64


def test_the_staging_areas_count_in_the_memory_check(kvm, monkeypatch):
    """2 uffds x 3 readers: six staging areas of 256 KiB beside the 8 MiB
    region, in ordinary memory: run() refuses the run when MemAvailable
    cannot hold them too, before anything is built, and runs it when it can."""
    needs_move()
    run_module = sys.modules["uffdkvm.run"]
    fields = dict(resolve="move", vcpus=2, mem_per_vcpu="4M", readers=3)
    need = 8 * (1 << 20) + 6 * (256 << 10)
    monkeypatch.setattr(run_module, "_mem_available", lambda: need - 1)
    with pytest.raises(HostUnsupportedError) as info:
        uffdkvm.run(**fields)
    assert "the run would demand-page 8M (vcpus * mem_per_vcpu) plus 1536K of move staging " \
           "areas, more than" in str(info.value), str(info.value)
    monkeypatch.setattr(run_module, "_mem_available", lambda: need)
    r = uffdkvm.run(**fields)
    assert r.verified, r.verify_message
