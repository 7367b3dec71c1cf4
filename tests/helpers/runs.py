"""Runs the tests share: a small one that must verify, one that skips where
the host cannot run its config, and one with a failure injected."""
import uffdkvm

from .hostfacts import facts_for_run, host_skip
from .skips import needs_test_hooks

# Small enough to keep each run well under a second, large enough that every
# reader sees work: 2 vCPUs x 16 MiB is 8192 faults.
SMALL = dict(vcpus=2, mem_per_vcpu="16M")
SMALL_PAGES = 2 * 16 * 1024 * 1024 // 4096


def small(**fields):
    """A small experiment that must verify."""
    r = uffdkvm.run(**{**SMALL, **fields})
    assert r.verified, r.verify_message
    assert r.bad_pages == 0
    return r


def run_or_skip(**fields):
    """Runs an experiment that must verify; on HostUnsupportedError, skips
    citing the facts that can stop this config (facts_for_run)."""
    __tracebackhide__ = True
    try:
        r = uffdkvm.run(**fields)
    except uffdkvm.HostUnsupportedError as e:
        host_skip(facts_for_run(**fields), f"this host cannot: {e}")
    assert r.verified, r.verify_message
    return r


def run_with_fault(*args, **kwargs):
    """uffdkvm.testing._faults.run_with_fault(), or a skip in a build without test hooks."""
    __tracebackhide__ = True
    needs_test_hooks()
    from uffdkvm.testing._faults import run_with_fault as run
    return run(*args, **kwargs)
