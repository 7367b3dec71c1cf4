"""Config.preinstall: pages put in from the page source's local copy before
the vCPUs start (a migration's pre-copied pages, uffdkvm.migrate's
destination). They never fault, verification holds them to the source's
bytes, and neither prefetch nor the page server sees them again."""
from __future__ import annotations

import copy
import json

import pytest
from helpers.runs import run_or_skip

import uffdkvm
from uffdkvm import Config, ConfigError, Result, ResultError

pytestmark = pytest.mark.kvm

PAGES = 1024  # 4 MiB per vCPU, 2 vCPUs


def _run(snapshot, **more):
    return run_or_skip(**{"vcpus": 2, "mem_per_vcpu": "4M", "source": "file",
                          "source_path": snapshot, "write_percent": 50, **more})


def test_every_page_preinstalled_faults_none(kvm, snapshot):
    r = _run(snapshot, preinstall=range(2 * PAGES))
    assert r.faults == 0 and r.preinstalled_pages == 2 * PAGES and r.verified
    assert r.prefetched_pages == 0 and r.preinstall_seconds > 0


def test_the_rest_fault_each_once(kvm, snapshot):
    half = list(range(0, 2 * PAGES, 2))
    r = _run(snapshot, preinstall=half)
    assert r.faults == PAGES and r.preinstalled_pages == PAGES and r.verified
    assert r.faults_avoided == PAGES
    df = r.to_frame()
    assert int(df["preinstalled_pages"].iloc[0]) == PAGES


def test_the_page_server_and_the_stream_serve_only_the_rest(kvm, snapshot):
    half = list(range(PAGES))  # vCPU 0's slice
    r = _run(snapshot, source="remote", preinstall=half, prefetch="background")
    assert r.verified and r.preinstalled_pages == PAGES
    assert r.faults + r.pushed_pages == PAGES  # vCPU 1's, each once
    # The server fetched nothing of vCPU 0's: what it sent is vCPU 1's, and
    # more only where a fault and the stream fetched a page at once.
    assert PAGES * 4096 <= r.page_server.bytes <= (PAGES + r.prefetch_eexist + r.eexist) * 4096


@pytest.mark.parametrize("fields, message", [
    (dict(preinstall=[1]), "preinstall: its pages come from a local copy"),
    (dict(preinstall=[1], source="file", resolve="move"), "needs uffd_mode='missing' with "
     "resolve='copy'"),
    (dict(preinstall=[10**6], source="file"), "beyond the region's"),
    (dict(preinstall=[3, 3], source="file"), "entry 1 repeats page 3"),
    (dict(preinstall=[-1], source="file"), "not a page index"),
    (dict(preinstall=5, source="file"), "a sequence of page indices"),
    (dict(preinstall=[1], uffd_mode=None), "preinstall: applies to uffd_mode='missing'"),
])
def test_bad_preinstall_is_refused_naming_it(kvm, snapshot, fields, message):
    if fields.get("source") == "file":
        fields["source_path"] = snapshot
    with pytest.raises(ConfigError, match=message) as info:
        uffdkvm.run(Config(vcpus=2, mem_per_vcpu="4M", **{k: v for k, v in fields.items()
                                                          if k != "preinstall"}),
                    preinstall=fields["preinstall"])
    assert info.value.field == "preinstall"


# ---- smaller runs, each against a record of its own: the fault trace (no
# preinstalled page faults), the page server's counters (none is asked for),
# the pusher's and readahead's counts (no EEXIST for them)

PAGE = 4096
VCPUS = 2
MEM = 1 << 20                     # per vCPU: 256 pages of 4 KiB
REGION = VCPUS * MEM
REGION_PAGES = REGION // PAGE
EVERY_OTHER = tuple(range(0, REGION_PAGES, 2))
FIRST_HALF = tuple(range(REGION_PAGES // 2))


def file_run(snapshot, **fields):
    return run_or_skip(**{"vcpus": VCPUS, "mem_per_vcpu": MEM, "source": "file",
                          "source_path": snapshot, **fields})


def traced_pages(r):
    """The pages (of 4 KiB, from the region's start) the fault trace resolved."""
    assert r.fault_trace is not None and r.region_gpa is not None
    return {(gpa - r.region_gpa) // PAGE for gpa in r.fault_trace.gpa}


# ---- what faults, and what is verified

def test_every_page_preinstalled_none_faults(kvm, snapshot):
    r = file_run(snapshot, preinstall=range(REGION_PAGES))
    assert r.verified, r.verify_message
    assert r.faults == 0 and r.eexist == 0
    assert r.preinstalled_pages == REGION_PAGES
    assert r.preinstall_seconds is not None and r.preinstall_seconds > 0
    # Not prefetch's: neither prefetched nor wasted, and none waited for.
    assert r.prefetched_pages == 0 and r.wasted_prefetch_pages == 0
    assert r.faulted_pages == 0 and r.faults_avoided == REGION_PAGES
    assert r.source_bytes == 0          # no reader fetched anything
    assert r.resident_seconds == 0      # all there before the first KVM_RUN


@pytest.mark.parametrize("listed", [EVERY_OTHER, FIRST_HALF], ids=["every-other", "first-half"])
def test_only_the_rest_fault(kvm, snapshot, listed):
    r = file_run(snapshot, preinstall=listed, trace_faults=True)
    assert r.verified, r.verify_message
    rest = set(range(REGION_PAGES)) - set(listed)
    assert r.faults == len(rest) and r.preinstalled_pages == len(listed)
    # The trace, a record of its own: exactly the other pages faulted.
    assert traced_pages(r) == rest
    assert r.source_bytes == len(rest) * PAGE
    assert r.prefetched_pages == 0 and r.faulted_pages == len(rest)
    assert r.config.preinstall == tuple(listed)


def test_the_frame_and_json_carry_the_fields(kvm, snapshot):
    r = file_run(snapshot, preinstall=EVERY_OTHER)
    row = r.to_frame().iloc[0]
    assert row["preinstalled_pages"] == len(EVERY_OTHER)
    assert row["preinstall_seconds"] == r.preinstall_seconds > 0
    back = Result.from_json(r.to_json())
    assert back == r and back.preinstalled_pages == len(EVERY_OTHER)
    assert back.config.preinstall == EVERY_OTHER


def test_a_run_without_it_counts_none(kvm, snapshot):
    r = file_run(snapshot)
    assert r.preinstalled_pages == 0 and r.faults == REGION_PAGES
    # Where pages are not tracked, nothing is measured.
    r = run_or_skip(vcpus=VCPUS, mem_per_vcpu=MEM, prefault=True)
    assert r.preinstalled_pages is None and r.preinstall_seconds is None


def test_a_touch_order_file_is_taken(kvm, snapshot, tmp_path):
    """The path form replay_from takes: a recorded order, installed first."""
    recorded = file_run(snapshot, record_touch_order=True)
    path = tmp_path / "order.txt"
    recorded.save_touch_order(path)
    half = recorded.touch_order[:REGION_PAGES // 2]
    (tmp_path / "half.txt").write_text(
        "".join(line + "\n" for line in path.read_text().splitlines()[:1 + len(half)]))
    r = file_run(snapshot, preinstall=str(tmp_path / "half.txt"))
    assert r.config.preinstall == tuple(half)
    assert r.verified, r.verify_message
    assert r.faults == REGION_PAGES - len(half)


@pytest.mark.parametrize("fields", [dict(resolver="vcpu"), dict(single_uffd=True),
                                    dict(readers=3), dict(source_read="mmap"),
                                    dict(passes=3, write_percent=50),
                                    dict(backing="shmem")],
                         ids=["vcpu-resolver", "single-uffd", "readers-3", "mmap", "passes",
                              "shmem"])
def test_every_way_of_resolving_faults_only_the_rest(kvm, snapshot, fields):
    r = file_run(snapshot, preinstall=EVERY_OTHER, **fields)
    assert r.verified, r.verify_message
    assert r.faults == REGION_PAGES - len(EVERY_OTHER)
    assert r.preinstalled_pages == len(EVERY_OTHER)


def test_overlapping_vcpus_share_the_preinstalled_pages(kvm, snapshot):
    r = file_run(snapshot, overlap=True, preinstall=range(0, MEM // PAGE, 2))
    assert r.verified, r.verify_message
    assert r.faults == MEM // PAGE // 2


def test_a_partial_working_set(kvm, snapshot):
    """touch_percent: the core's own count of expected faults leaves out the
    preinstalled pages the guest touches (and verify passes on them)."""
    r = file_run(snapshot, preinstall=EVERY_OTHER, touch_percent=50, trace_faults=True)
    assert r.verified, r.verify_message
    assert not traced_pages(r) & set(EVERY_OTHER)
    assert 0 < r.faults < r.touched_pages


# ---- the page server is not asked for them

def test_remote_fetches_only_the_rest_from_the_server(kvm, snapshot):
    r = run_or_skip(vcpus=VCPUS, mem_per_vcpu=MEM, source="remote", source_path=snapshot,
                    preinstall=EVERY_OTHER, trace_faults=True)
    assert r.verified, r.verify_message
    rest = REGION_PAGES - len(EVERY_OTHER)
    assert r.faults == rest and r.preinstalled_pages == len(EVERY_OTHER)
    s = r.page_server
    assert s is not None and s.errors == 0
    # The server's own counters (another process's): one urgent request per
    # fault, none for a preinstalled page, and only their bytes.
    assert s.urgent == s.requests == rest and s.background == 0
    assert s.bytes == rest * PAGE
    assert not traced_pages(r) & set(EVERY_OTHER)


def test_remote_with_every_page_preinstalled_asks_for_nothing(kvm, snapshot):
    r = run_or_skip(vcpus=VCPUS, mem_per_vcpu=MEM, source="remote", source_path=snapshot,
                    preinstall=range(REGION_PAGES))
    assert r.verified, r.verify_message
    assert r.faults == 0 and r.page_server is not None
    assert r.page_server.requests == 0 and r.page_server.bytes == 0


# ---- prefetch skips them

@pytest.mark.parametrize("source", ["file", "remote"])
def test_the_pusher_installs_only_the_rest(kvm, snapshot, source):
    """prefetch='background' goes in address order: had it not seen the
    preinstalled pages as present, each would be an EEXIST (prefetch_eexist).
    Each other page goes in once, by the pusher or by a fault; a pusher
    EEXIST can only be a page a fault got first."""
    r = run_or_skip(vcpus=VCPUS, mem_per_vcpu=MEM, source=source, source_path=snapshot,
                    preinstall=EVERY_OTHER, prefetch="background")
    assert r.verified, r.verify_message
    rest = REGION_PAGES - len(EVERY_OTHER)
    assert r.pushed_pages + r.faults == rest, (r.pushed_pages, r.faults)
    assert r.prefetched_pages == r.pushed_pages
    assert r.prefetch_eexist <= r.faults, (r.prefetch_eexist, r.faults)
    assert r.pusher_source_bytes <= rest * PAGE
    if source == "remote":
        # The faults' fetches, urgent (a fault whose page the pusher then
        # installed first fetched too: an eexist); the pusher's are its own
        # (in flight at the end, or raced by a fault, a few more are served).
        s = r.page_server
        assert s is not None and s.urgent == sum(x.source_bytes for x in r.readers) // PAGE
        assert s.urgent <= r.faults + r.eexist


def test_replay_skips_them_too(kvm, snapshot):
    r = file_run(snapshot, preinstall=FIRST_HALF, prefetch="replay",
                 replay_from=range(REGION_PAGES - 1, -1, -1))
    assert r.verified, r.verify_message
    rest = REGION_PAGES - len(FIRST_HALF)
    assert r.pushed_pages + r.faults == rest
    assert r.prefetch_eexist <= r.faults


def test_readahead_skips_them(kvm, snapshot):
    r = file_run(snapshot, preinstall=EVERY_OTHER, prefetch="readahead", prefetch_pages=8)
    assert r.verified, r.verify_message
    rest = REGION_PAGES - len(EVERY_OTHER)
    assert r.prefetched_pages + r.faults == rest
    assert r.prefetch_eexist <= r.faults + r.eexist


# ---- what is refused

REFUSED = [
    (dict(prefault=True), "prefault=True"),
    (dict(uffd_mode="wp"), "uffd_mode='missing'"),
    (dict(uffd_mode="minor", backing="shmem"), "uffd_mode='missing'"),
    (dict(uffd_mode=None), "uffd_mode='missing'"),
    (dict(resolve="zeropage"), "resolve='copy'"),
    (dict(resolve="move"), "resolve='copy'"),
    (dict(source="synthetic", source_path=None), "source='file' with source_path"),
    (dict(source="remote", source_path=None), "without source_path"),
    (dict(preinstall=[3, 7, 3]), r"entry 2 repeats page 3 \(of the region's 512 pages\)"),
    (dict(preinstall=[0, REGION_PAGES]), "entry 1 is page 512, beyond the region's 512 pages"),
    (dict(preinstall=[-1]), "not a page index"),
    (dict(preinstall=range(REGION_PAGES + 1)), "more than the region's 512 pages"),
    (dict(preinstall=42), "expected a path"),
]


@pytest.mark.parametrize("fields, match", REFUSED, ids=[m for _, m in REFUSED])
def test_each_refusal_names_preinstall(snapshot, fields, match):
    base = dict(vcpus=VCPUS, mem_per_vcpu=MEM, source="file", source_path=snapshot,
                preinstall=[1, 2])
    with pytest.raises(ConfigError, match=match) as info:
        Config(**{**base, **fields})
    assert info.value.field == "preinstall"
    assert str(info.value).startswith("preinstall: ")


def test_hugetlb_pages_count_in_huge_pages(snapshot):
    """Indices are pages of the backing's page size: 2 MiB pages here."""
    base = dict(vcpus=VCPUS, mem_per_vcpu=2 << 20, source="file", source_path=snapshot,
                backing="anonymous_hugetlb")
    with pytest.raises(ConfigError, match="beyond the region's 2 pages"):
        Config(**base, preinstall=[2])


# ---- what a Result must hold

@pytest.fixture(scope="module")
def preinstalled_json(kvm_reason, snapshot):
    from helpers.skips import skip_without_kvm
    skip_without_kvm(kvm_reason)
    r = uffdkvm.run(vcpus=VCPUS, mem_per_vcpu=MEM, source="file", source_path=snapshot,
                    preinstall=EVERY_OTHER, prefetch="readahead")
    assert r.verified, r.verify_message
    return json.loads(r.to_json())


@pytest.mark.parametrize("key, value, match", [
    ("preinstalled_pages", 7, r"\$\.preinstalled_pages: 7, but \$\.config\.preinstall lists"),
    ("preinstall_seconds", None, r"\$\.preinstall_seconds: null"),
    ("prefetched_pages", REGION_PAGES, r"preinstalled_pages \+ prefetched_pages: .*more than"),
])
def test_a_damaged_result_is_refused(preinstalled_json, key, value, match):
    data = copy.deepcopy(preinstalled_json)
    assert Result.from_json(json.dumps(data))
    data[key] = value
    if key == "prefetched_pages":   # keep the prefetch sums whole
        data["readers"][0]["prefetched"] += value - preinstalled_json[key]
    with pytest.raises(ResultError, match=match):
        Result.from_json(json.dumps(data))
