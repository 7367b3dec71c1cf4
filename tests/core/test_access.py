"""Guest access models beyond whole-region walks: touch_percent (a seeded
working set: the rest of the region is never touched, so it never faults)
and access="zipf" (hot pages visited many times a pass, cold ones rarely or
never). Each is checked against the kernel's own record of what faulted (the
fault trace) and against the guest's own write counts (verification)."""
from __future__ import annotations

import json
import subprocess

import pytest

import uffdkvm
from helpers.children import ENV as CHILD_ENV
from helpers.children import uffdkvm_command
from helpers.guest_clock import guest_clock_converted
from helpers.runs import run_or_skip, run_with_fault
from uffdkvm import ConfigError

pytestmark = pytest.mark.kvm

PAGE = 4096
MEM = "4M"  # 1024 pages a vCPU: enough for shares to show, fast to run
PAGES = (4 << 20) // PAGE


def faulted_pages(r):
    """The 4 KiB pages (index in the region) userfaultfd resolved, in the order
    the readers read them: the kernel's record, not the host's plan."""
    t = r.fault_trace
    order = sorted(range(len(t.gpa)), key=lambda i: t.read_ns[i])
    return [t.gpa[i] for i in order if not t.eexist[i]]


def visited(r):
    """The pages the host counted visits to (verified against the guest)."""
    return {i for i, n in enumerate(r.page_visits) if n}


def test_default_walk_touches_every_page_once(kvm):
    r = run_or_skip(mem_per_vcpu=MEM, passes=2, trace_faults=True)
    assert r.touched_pages == PAGES
    assert r.guest_accesses == 2 * PAGES
    assert r.faults == PAGES
    assert r.page_visits is None  # nothing listed: every page once, as ever


@pytest.mark.parametrize("pattern", ["sequential", "reverse", "random"])
@pytest.mark.parametrize("write_percent", [100, 40])
def test_touch_percent_faults_exactly_its_subset(kvm, pattern, write_percent):
    r = run_or_skip(mem_per_vcpu=MEM, touch_percent=25, pattern=pattern,
                    write_percent=write_percent, passes=2, trace_faults=True)
    # About a quarter of the pages, and one fault for each, none elsewhere.
    assert 0.15 * PAGES < r.touched_pages < 0.35 * PAGES, r.touched_pages
    assert r.faults == r.touched_pages
    assert r.guest_accesses == 2 * r.touched_pages
    faulted = faulted_pages(r)
    assert len(faulted) == len(set(faulted)) == r.touched_pages
    # The kernel's faults are exactly the pages the host says the guest visits
    # (lined up by their lowest page: the region's address is not in a Result).
    first = min(faulted)
    touched = visited(r)
    offset = min(touched)
    assert {(g - first) // PAGE + offset for g in faulted} == touched
    assert all(r.page_visits[i] == 1 for i in touched)  # uniform: once a pass
    # In the pattern's order (one vCPU, one reader: faults are read in order).
    if pattern == "sequential":
        assert faulted == sorted(faulted)
    elif pattern == "reverse":
        assert faulted == sorted(faulted, reverse=True)
    else:
        assert faulted not in (sorted(faulted), sorted(faulted, reverse=True))


def test_seeds_choose_the_subset(kvm):
    def subset(seed):
        r = run_or_skip(mem_per_vcpu=MEM, touch_percent=30, seed=seed, trace_faults=True)
        assert r.faults == r.touched_pages
        return frozenset(r.fault_trace.gpa)

    a, b, again = subset(1), subset(2), subset(1)
    assert a == again
    assert a != b
    # Both about 30% of the region, overlapping about as independent draws do.
    assert 0.2 * PAGES < len(a) < 0.4 * PAGES and 0.2 * PAGES < len(b) < 0.4 * PAGES
    assert len(a & b) < 0.6 * min(len(a), len(b))


def test_zipf_makes_hot_pages_take_most_accesses(kvm):
    r = run_or_skip(mem_per_vcpu=MEM, access="zipf", zipf_theta=0.99, accesses=4 * PAGES,
                    passes=2, trace_faults=True)
    # Verified: each page's word 2 held its visits x passes, written by the guest.
    assert r.guest_accesses == 2 * 4 * PAGES
    assert sum(r.page_visits) == 4 * PAGES
    hot = sorted(r.page_visits, reverse=True)
    assert sum(hot[:PAGES // 10]) > 0.5 * sum(hot), hot[:20]
    assert hot[0] > 50  # the hottest page, many times a pass
    # Some cold pages never touched: they never fault.
    assert r.touched_pages < 0.9 * PAGES
    assert r.faults == r.touched_pages == len(visited(r))
    assert len(set(r.fault_trace.gpa)) == r.touched_pages


def test_zipf_theta_sets_the_skew(kvm):
    def top_share(theta):
        r = run_or_skip(mem_per_vcpu=MEM, access="zipf", zipf_theta=theta, trace_faults=True)
        assert r.guest_accesses == PAGES  # accesses default: the touched pages
        hot = sorted(r.page_visits, reverse=True)
        return sum(hot[:PAGES // 10]) / sum(hot)

    assert top_share(0.3) < top_share(0.99) < top_share(1.5)


def test_zipf_over_a_working_set(kvm):
    r = run_or_skip(mem_per_vcpu=MEM, access="zipf", zipf_theta=0.99, touch_percent=20,
                    accesses=2 * PAGES, write_percent=50, trace_faults=True)
    subset = run_or_skip(mem_per_vcpu=MEM, touch_percent=20, trace_faults=True)
    # The draws land only in the working set touch_percent chose.
    assert visited(r) <= visited(subset)
    assert r.faults == r.touched_pages < subset.touched_pages


@pytest.mark.parametrize("fields", [
    dict(vcpus=2, overlap=True, touch_percent=40, write_percent=50),
    dict(vcpus=2, overlap=True, access="zipf", zipf_theta=0.99, write_percent=50),
    dict(vcpus=2, single_uffd=True, touch_percent=30, readers=2),
    dict(vcpus=2, touch_percent=30, pattern="random"),
    dict(touch_percent=30, resolver="vcpu"),
    dict(vcpus=2, access="zipf", zipf_theta=1.1, resolver="vcpu", write_percent=50),
], ids=["overlap", "overlap-zipf", "single-uffd", "per-vcpu-uffds", "resolver-vcpu",
        "resolver-vcpu-zipf"])
def test_models_combine(kvm, fields):
    r = run_or_skip(mem_per_vcpu=MEM, trace_faults=True, **fields)
    region = r.config.region_bytes // PAGE
    assert r.touched_pages == len(visited(r)) < 0.9 * region
    # One fault per touched page (overlap: racing vCPUs meet EEXIST, not counted).
    assert r.faults == r.touched_pages
    assert len(set(r.fault_trace.gpa)) == r.touched_pages
    vcpus = r.config.vcpus
    if fields.get("access") == "zipf":
        assert r.guest_accesses == vcpus * r.config.pages_per_vcpu
    elif fields.get("overlap"):
        # The working set is a hash of the page frame: the same for every vCPU.
        assert r.guest_accesses == vcpus * r.touched_pages
        assert set(r.page_visits) <= {0, vcpus}
    else:
        assert r.guest_accesses == r.touched_pages


@pytest.mark.parametrize("model", [dict(touch_percent=1),
                                   dict(access="zipf", zipf_theta=0.99, accesses=2)],
                         ids=["touch", "zipf-2-accesses"])
@pytest.mark.parametrize("backing", ["anonymous_thp", "anonymous_hugetlb"])
def test_untouched_pages_of_a_touched_huge_page(kvm, hugepages, backing, model):
    """Huge pages: a fault resolves the 2 MiB page around the touched 4 KiB
    one, so its untouched pages hold the resolver's data (verified); the
    faults are one per huge page with a touched page in it, and a huge page
    with none never faults (2 accesses reach at most 2 of the 4)."""
    r = run_or_skip(mem_per_vcpu="8M", backing=backing, trace_faults=True, **model)
    huge = {i // 512 for i in visited(r)}
    assert r.faults == len(huge)
    assert len({g // (2 << 20) for g in r.fault_trace.gpa}) == len(r.fault_trace.gpa) == \
        len(huge)  # one fault record per huge page the guest touched, no other
    assert r.touched_pages < PAGES // 10
    if "accesses" in model:
        assert len(huge) <= 2


@pytest.mark.parametrize("fields", [
    dict(uffd_mode="wp", write_percent=100),
    dict(prefault=True),
    dict(uffd_mode=None),
    dict(guest_timing=True),
    dict(guest_timing=True, access="zipf", zipf_theta=0.99, accesses=2 * PAGES),
    dict(resolve="zeropage"),
], ids=["wp", "prefault", "no-uffd", "guest-timing", "guest-timing-zipf", "zeropage"])
def test_other_modes_verify(kvm, fields):
    fields = {"touch_percent": 30, **fields}
    r = run_or_skip(mem_per_vcpu=MEM, **fields)
    assert r.touched_pages < 0.5 * PAGES
    if fields.get("prefault") or fields.get("uffd_mode", "missing") is None:
        assert r.faults == 0
    else:  # wp: every touched page is written, so each faults once
        assert r.faults == r.touched_pages
    if fields.get("access") == "zipf":
        assert r.guest_accesses == fields["accesses"]
    if fields.get("guest_timing") and guest_clock_converted(r):
        assert r.fault_latency is not None and r.fault_latency.count == r.faults


@pytest.mark.parametrize("fields", [
    dict(touch_percent=25, write_percent=100),
    dict(touch_percent=25, write_percent=0),
    dict(access="zipf", zipf_theta=0.99, write_percent=50),
], ids=["written", "read", "zipf"])
def test_verification_catches_a_touched_page_reported_untouched(kvm, fields):
    """The host's record forgets one page the guest does touch (test hook):
    the page holds the guest's write, or was faulted in and read, where the
    host expects nothing, and the run must not verify."""
    r = run_with_fault(uffdkvm.Config(mem_per_vcpu=MEM, **fields), "untouched_page", 0)
    assert not r.verified
    assert r.bad_pages > 0 or "checksum" in r.verify_message, r.verify_message


@pytest.mark.parametrize("fields, field, words", [
    (dict(zipf_theta=0.99), "zipf_theta", "access='zipf'"),
    (dict(accesses=100), "accesses", "access='zipf'"),
    (dict(access="zipf"), "zipf_theta", "0.99"),
    (dict(access="zipf", zipf_theta=0), "zipf_theta", "above 0"),
    (dict(access="zipf", zipf_theta=0.99, pattern="random"), "pattern", "sequential"),
    (dict(access="zipf", zipf_theta=0.99, accesses=0), "accesses", "between 1"),
    (dict(access="zipf", zipf_theta=0.99, accesses=1 << 30), "accesses", "between 1"),
    (dict(touch_percent=0), "touch_percent", "between 1 and 100"),
    (dict(touch_percent=101), "touch_percent", "between 1 and 100"),
    (dict(access="pareto"), "access", "'uniform'"),
])
def test_bad_access_config_names_the_field(fields, field, words):
    with pytest.raises(ConfigError) as e:
        uffdkvm.Config(**fields)
    assert e.value.field == field
    assert field in str(e.value) and words in str(e.value)


def test_cli_flags_reach_the_run(kvm):
    out = subprocess.run(
        uffdkvm_command("-b", MEM, "--touch-percent", "25", "--access",
                        "zipf", "--zipf-theta", "1.2", "--accesses", "3000", "--json", "-q"),
        capture_output=True, text=True, env=CHILD_ENV, timeout=120)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    c = d["config"]
    assert (c["touch_percent"], c["access"], c["zipf_theta"], c["accesses"]) == \
        (25, "zipf", 1.2, 3000)
    assert d["guest_accesses"] == 3000
    assert d["faults"] == d["touched_pages"] < 0.35 * PAGES


def test_the_core_refuses_visit_counts_that_would_overflow(kvm):
    """Overlapped vCPUs add their draws to one count a page (32 bits): the
    core refuses a product that could overflow it, naming the field."""
    with pytest.raises(ConfigError) as e:
        uffdkvm.run(mem_per_vcpu="64K", vcpus=300, overlap=True, access="zipf",
                    zipf_theta=1.0, accesses=1 << 24)
    assert e.value.field == "accesses" and "2^32" in str(e.value)
