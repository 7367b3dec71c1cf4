"""Config.preinstall: pages put in from the page source's local copy before
the vCPUs start (a migration's pre-copied pages, uffdkvm.migrate's
destination). They never fault, verification holds them to the source's
bytes, and neither prefetch nor the page server sees them again."""
from __future__ import annotations

import pytest
from conftest import run_or_skip

import uffdkvm
from uffdkvm import Config, ConfigError

pytestmark = pytest.mark.kvm

PAGES = 1024  # 4 MiB per vCPU, 2 vCPUs


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    return str(uffdkvm.make_snapshot(tmp_path_factory.mktemp("pre") / "mem.img", 8 << 20))


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
