"""benchmarks/scaling.py in its tiny mode, as the lead runs it (a child
process with the CLI's flags): the JSON has every sweep's points, every
overhead is the one its rates give, by overhead.py's formula, and the
script's raise of /proc/sys/vm/nr_hugepages is taken back.

    python benchmarks/scaling.py --trials 9 --big-trials 2 --pin-vcpus 0,1 --json scaling.json
"""
import importlib.util
import json
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest
from helpers.hostfacts import HUGEPAGES_LOCK, NOT_ROOT, NO_HUGEPAGES_2M, _pools_locked, host_skip
from helpers.skips import skip_without_kvm

from uffdkvm._spawn import child_env

# alone (tests/helpers/machine_lock.py): the script raises the host's huge page pool.
pytestmark = [pytest.mark.kvm, pytest.mark.alone]

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "scaling.py"
NR_HUGEPAGES = pathlib.Path("/proc/sys/vm/nr_hugepages")


def load_scaling():
    spec = importlib.util.spec_from_file_location("scaling", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["scaling"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def hugepages():
    """nr_hugepages, read under the lock the script and tests/helpers/hostfacts.py
    change the pools under (so no other session's change is half seen)."""
    with _pools_locked():
        return int(NR_HUGEPAGES.read_text())


@pytest.fixture(scope="module")
def tiny(kvm_reason, tmp_path_factory):
    skip_without_kvm(kvm_reason)
    out = tmp_path_factory.mktemp("scaling") / "scaling.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "8M", "--vcpus", "1,2",
                        "--mem-per-vcpu", "4M", "--trials", "2", "--big-trials", "1",
                        "--big-from", "8M", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env=child_env())
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text()), p.stdout, p.stderr


def test_every_sweep_has_its_points(tiny):
    record, _, _ = tiny
    assert [m["vcpus"] for m in record["vcpus"]] == [1, 2]
    backings = [m["backing"] for m in record["memory"]]
    assert "anonymous" in backings
    # hugetlb measured, or its skip given with the reason
    assert "anonymous_hugetlb" in backings or any(
        "anonymous_hugetlb" in s for s in record["skipped"])
    assert [(p["mem_per_vcpu"], p["vcpus"]) for p in record["phases"]] == \
        [("8M", 1), ("4M", 1), ("4M", 2)]


def test_big_sizes_run_their_own_trials(tiny):
    """--big-from 8M: the 8M points are big, and run --big-trials (1) trials;
    the vCPU sweep's run --trials (2)."""
    record, _, _ = tiny
    for m in record["memory"]:
        assert m["trials"] == 1
        assert all(len(v) == 1 for v in m["rates"].values())
    for m in record["vcpus"]:
        assert m["trials"] == 2
        assert all(len(v) == 2 for v in m["rates"].values())


def test_every_overhead_is_computed_from_its_rates(tiny):
    record, _, _ = tiny
    for m in record["memory"] + record["vcpus"]:
        uffd, none = m["rates"]["uffdkvm uffd"], m["rates"]["uffdkvm none"]
        assert len(m["us_per_page"]) == len(uffd) == len(none) == m["trials"]
        for u, n, page, fault in zip(uffd, none, m["us_per_page"], m["us_per_fault"],
                                     strict=True):
            assert u and n, m  # every run of this tiny mode succeeds
            assert math.isclose(page, m["vcpus"] * (1 / u - 1 / n) * 1e6, rel_tol=1e-9)
            assert math.isclose(fault, page * m["pages_per_fault"], rel_tol=1e-9)
        cpus = len(os.sched_getaffinity(0))  # what the script counts, not os.cpu_count()
        busy = min(m["vcpus"], cpus)
        assert m["busy_cpus"] == busy
        for u, n, cpu in zip(uffd, none, m["cpu_us_per_fault"], strict=True):
            assert math.isclose(cpu, busy * (1 / u - 1 / n) * 1e6 * m["pages_per_fault"],
                                rel_tol=1e-9)
        assert m["pages_per_fault"] == (512 if m["backing"] == "anonymous_hugetlb" else 1)
        assert m["oversubscribed"] == (m["vcpus"] > cpus)
        assert m["pages"] == m["vcpus"] * (8 if m["sweep"] == "memory" else 4) * 256


def test_phases_add_up(tiny):
    record, _, _ = tiny
    for p in record["phases"]:
        assert p["verified"]
        assert 0 < p["paging_s"] < p["wall_s"]
        assert math.isclose(p["outside_paging_s"], p["wall_s"] - p["paging_s"], rel_tol=1e-9)
        setup, after = p["setup_seen_s"], p["after_paging_seen_s"]
        # None where no progress tick came after setup (or after paging)
        assert after is None or setup is not None
        assert setup is None or 0 <= setup <= p["wall_s"]
        assert after is None or 0 <= after <= p["wall_s"] - setup


def test_the_tables_and_the_estimate_are_printed(tiny):
    _, out, err = tiny
    assert "estimate: about" in err
    assert "| memory | backing | trials |" in out
    assert "| us/fault | CPU us/fault |" in out
    assert "| memory/vCPU | vCPUs | pages | paging | outside paging |" in out


def test_hugepages_are_raised_for_the_run_and_put_back(capsys):
    """The script's own Hugepages, on the real pool: asked for 2 pages more
    than are free, it raises nr_hugepages by 2, and restore() takes exactly
    those 2 back. Other sessions may change the pool meanwhile (by counts,
    under the same lock), so what is checked is the script's own count and
    the values it read under that lock, not a before/after of the pool."""
    if NOT_ROOT.holds:
        host_skip(NOT_ROOT, "the script raises /proc/sys/vm/nr_hugepages, which needs root")
    if NO_HUGEPAGES_2M.holds or not NR_HUGEPAGES.exists():
        host_skip(NO_HUGEPAGES_2M, f"the kernel finds 2 more 2 MiB pages ({NR_HUGEPAGES})")
    scaling = load_scaling()
    assert scaling.HUGEPAGES_LOCK == HUGEPAGES_LOCK  # one lock for the script and the suite
    h = scaling.Hugepages()
    try:
        want = h.free() + 2
        got = h.reserve(want)
        added = h.added
        raised = hugepages()
    finally:
        h.restore()
    assert added == 2, f"asked for 2 more pages, the script counted {added} added"
    assert got >= want
    assert raised >= 2  # the pool held the 2 added while the run would use them
    # restore() said, from its reads under the lock: NOW -> NOW - 2
    m = re.search(r"the (\d+) pages added taken back \((\d+) -> (\d+);", capsys.readouterr().err)
    assert m, "restore() did not say what it took back"
    assert int(m[1]) == 2 and int(m[3]) == int(m[2]) - 2, m[0]
    assert h.added == 0


def test_pin_vcpus_pins_every_run(kvm_reason):
    """--pin-vcpus reaches the memory and vCPU sweeps' commands and the
    phase runs, whose default fault path then spins its readers beside
    their vCPUs."""
    skip_without_kvm(kvm_reason)
    scaling = load_scaling()
    cpu = min(os.sched_getaffinity(0))
    a = scaling.argparse.Namespace(pin_vcpus=str(cpu), mem_per_vcpu="4M", vcpus=[1, 2],
                                   trials=1, big_trials=1, big_from="1G", sizes=["4M"])
    memory, _ = scaling.memory_points(a, "anonymous", None)
    for point in memory + scaling.vcpu_points(a):
        assert point.flags[-2:] == ["--pin-vcpus", str(cpu)]
        for cmd in point.commands().values():
            assert "--pin-vcpus" in cmd
    pinned, unpinned = scaling.phases_of("4M", 1, str(cpu)), scaling.phases_of("4M", 1, None)
    assert pinned["verified"] and pinned["reader_wait"] == "spin_idle"
    assert pinned["vcpu_cpus"] == [[cpu]]
    assert unpinned["reader_wait"] == "epoll_exclusive"
    assert unpinned["vcpu_cpus"] == [sorted(os.sched_getaffinity(0))]
