"""uffdkvm's pytest plugin, registered as the ``pytest11`` entry point
``uffdkvm``: pytest loads it wherever uffdkvm is installed, and it stays
inert for a suite that does not use it (``-p no:uffdkvm`` turns it off).

- ``uffdkvm_host``: the :class:`~uffdkvm.HostInfo`; skips the test with the
  host's reason where /dev/kvm or userfaultfd is unusable.
- ``uffdkvm_run``: :func:`uffdkvm.run` that records each Result it returns:
  its key figures go into the test's ``user_properties`` (so JUnit XML
  carries them), and with ``--uffdkvm-results PATH`` a JSON line per run
  into PATH (:func:`uffdkvm.load_results` reads it back).
- ``@pytest.mark.uffdkvm_requires(*features, **fields)``: what the test needs
  of the host; it skips, with the host's reason, where the host lacks it.
  An unknown feature or field is a usage error at collection.

docs/pytest.md is the guide. Only pytest and the standard library are
imported here: the rest of uffdkvm when a test first needs it.
"""
from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ..host.facts import HostInfo
    from ..result import Result

MARKER = "uffdkvm_requires"

#: Each named feature as the smallest config that needs it: the host has the
#: feature where a one-vCPU, 16-page run of that config verifies (as
#: fault_path_support() and backing_support() check it).
FEATURES: dict[str, dict[str, Any]] = {
    "move": {"resolve": "move"},
    "wp_async": {"uffd_mode": "wp", "wp_async": True},
    "io_uring": {"wait": "io_uring"},
    "minor_shmem": {"backing": "shmem", "uffd_mode": "minor"},
}
#: Named features that are KVM capabilities, not configs (uffdkvm runs none
#: of them yet: a user's own code may): the name, KVM_CAP_* and its number
#: (include/uapi/linux/kvm.h). The host has one where /dev/kvm's
#: KVM_CHECK_EXTENSION answers it with a positive value (for the dirty ring:
#: the ring's largest size in bytes).
KVM_CAPS: dict[str, tuple[str, int]] = {
    "dirty_ring": ("KVM_CAP_DIRTY_LOG_RING", 192),
    "dirty_ring_acq_rel": ("KVM_CAP_DIRTY_LOG_RING_ACQ_REL", 223),
}
_KVM_CHECK_EXTENSION = 0xAE03  # _IO(KVMIO, 0x03)
#: Keywords of the marker that are counts, not Config fields.
COUNTS = ("hugepages", "cpus")
#: The key figures of each run that go into user_properties, under the name
#: each has in a DataFrame (frames.RESULT_RENAMES: paging_rate is pages_per_s).
PROPERTIES = ("paging_rate", "faults", "seconds", "verified")

_results_key = pytest.StashKey["_Recorder"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("uffdkvm")
    group.addoption("--uffdkvm-results", metavar="PATH", default=None,
                    help="write every run that the uffdkvm_run fixture made as a JSON line "
                         "into PATH (uffdkvm.load_results(PATH) reads it)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*features, **fields): skip unless this host has the features "
        f"({', '.join(FEATURES)}; hugepages=N free 2 MiB huge pages, cpus=N usable CPUs) "
        "and can run a Config of the fields (uffdkvm.probe)")
    path = config.getoption("uffdkvm_results")
    if path is not None:
        config.stash[_results_key] = _Recorder(path)


class _Recorder:
    """The --uffdkvm-results file: truncated at the session's start, one line
    appended (and flushed) per run."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            with open(path, "w", encoding="utf-8"):
                pass
        except OSError as e:
            raise pytest.UsageError(f"--uffdkvm-results {path}: cannot write it: {e}") from None

    def write(self, nodeid: str, result: Result) -> None:
        from ._recorded import record_line
        line = record_line(nodeid, result) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line)


# ---- the marker: checked at collection, established when a test runs ----

def _usage_errors(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[str]:
    errors = []
    for feature in args:
        if feature not in FEATURES and feature not in KVM_CAPS:
            errors.append(f"unknown feature {feature!r} "
                          f"(known: {', '.join([*FEATURES, *KVM_CAPS])})")
    fields = {}
    for name, value in kwargs.items():
        if name in COUNTS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                errors.append(f"{name}={value!r}: a count, an int of at least 1")
        else:
            fields[name] = value
    if fields:
        from ..config import Config
        from ..errors import ConfigError
        try:
            Config(**fields)
        except TypeError as e:
            known = (f.name for f in dataclasses.fields(Config))
            errors.append(f"{e} (a keyword is a feature count ({', '.join(COUNTS)}) or a "
                          f"Config field: {', '.join(known)})")
        except ConfigError as e:
            errors.append(str(e))
    return errors


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The only collection hook: a test without the marker costs one lookup."""
    errors = []
    for item in items:
        for mark in item.iter_markers(MARKER):
            errors += [f"{item.nodeid}: @pytest.mark.{MARKER}: {e}"
                       for e in _usage_errors(mark.args, mark.kwargs)]
    if errors:
        raise pytest.UsageError("\n".join(errors))


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers(MARKER):
        why = _missing(tuple(mark.args), tuple(sorted(mark.kwargs.items(), key=repr)))
        if why:
            pytest.skip(f"uffdkvm: {why}")


def _missing(features: tuple[str, ...], kwargs: tuple[tuple[str, Any], ...]) -> str | None:
    """Why this host cannot give what the marker asks, or None."""
    why = _kvm_unusable()
    if why:
        return why
    for feature in features:
        why = _feature_missing(feature)
        if why:
            return f"{feature}: {why}"
    fields = {}
    for name, value in kwargs:
        if name in COUNTS:
            why = _count_missing(name, value)
            if why:
                return why
        else:
            fields[name] = value
    if not fields:
        return None
    try:
        return _config_refused(tuple(fields.items()))
    except TypeError:  # a value that does not hash (a list of CPUs, say): asked uncached
        return _config_refused.__wrapped__(tuple(fields.items()))


@functools.cache
def _kvm_unusable() -> str | None:
    """Why no experiment runs here (no usable /dev/kvm or userfaultfd), or None:
    the smallest config, probed."""
    from ..errors import HostUnsupportedError
    from ..run import probe
    try:
        probe(vcpus=1, mem_per_vcpu="4K")
    except HostUnsupportedError as e:
        return str(e)
    return None


def kvm_cap_missing(cap: str, number: int, path: str = "/dev/kvm") -> str | None:
    """Why KVM does not offer capability `cap` (KVM_CAP_*, `number`), or None:
    its KVM_CHECK_EXTENSION answer on /dev/kvm, 0 meaning absent."""
    import fcntl
    import os
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        return f"cannot open {path}: {e}"
    try:
        answer = fcntl.ioctl(fd, _KVM_CHECK_EXTENSION, number)
    except OSError as e:
        return f"KVM_CHECK_EXTENSION({cap}) on {path}: {e}"
    finally:
        os.close(fd)
    if answer <= 0:
        return f"this KVM does not offer {cap} (KVM_CHECK_EXTENSION answers {answer})"
    return None


@functools.cache
def _feature_missing(feature: str) -> str | None:
    if feature in KVM_CAPS:
        return kvm_cap_missing(*KVM_CAPS[feature])
    from ..config import Config
    from ..errors import HostUnsupportedError
    from ..run import run
    try:
        r = run(Config(vcpus=1, mem_per_vcpu="64K", **FEATURES[feature]))
    except HostUnsupportedError as e:
        return str(e)
    return None if r.verified else f"a run with it did not verify: {r.verify_message}"


def _count_missing(name: str, wanted: int) -> str | None:
    from ..host.facts import HostInfo
    host = HostInfo.current()
    if name == "cpus":
        if host.usable_cpus < wanted:
            return (f"needs {wanted} CPUs; this process can run on {host.usable_cpus} "
                    f"of the host's {host.cpus}")
        return None
    if host.hugepages_2m_free < wanted:
        return (f"needs {wanted} free 2 MiB huge pages; the host has "
                f"{host.hugepages_2m_free} free of {host.hugepages_2m} "
                f"(as root: echo {host.hugepages_2m - host.hugepages_2m_free + wanted} "
                "> /proc/sys/vm/nr_hugepages)")
    return None


@functools.cache
def _config_refused(fields: tuple[tuple[str, Any], ...]) -> str | None:
    """Why probe() refuses a Config of these fields here, or None. Fields
    not given are the defaults, but for one vCPU and one page of memory."""
    from ..config import BACKING_PAGE_SIZES, Config
    from ..errors import HostUnsupportedError
    from ..run import probe
    given = dict(fields)
    given.setdefault("vcpus", 1)
    given.setdefault("mem_per_vcpu", BACKING_PAGE_SIZES[Config(**given).backing])
    try:
        probe(Config(**given))
    except HostUnsupportedError as e:
        return f"{', '.join(f'{k}={v!r}' for k, v in fields)}: {e}"
    return None


# ---- the fixtures ----

@pytest.fixture
def uffdkvm_host() -> HostInfo:
    """This host's HostInfo; skips the test where no experiment can run here
    (no usable /dev/kvm or userfaultfd), with the host's reason."""
    why = _kvm_unusable()
    if why:
        pytest.skip(f"uffdkvm: {why}")
    from ..host.facts import HostInfo
    return HostInfo.current()


@pytest.fixture
def uffdkvm_run(request: pytest.FixtureRequest) -> Callable[..., Result]:
    """uffdkvm.run, with run()'s signature, recording every Result it returns:
    its key figures into the test's user_properties (``uffdkvm[i].pages_per_s``,
    ``faults``, ``seconds``, ``verified`` for the test's i-th run) and, with
    --uffdkvm-results PATH, a JSON line into PATH."""
    from ..io.frames import RESULT_RENAMES
    from ..run import run
    names = {attr: RESULT_RENAMES.get(attr, attr) for attr in PROPERTIES}
    node = request.node
    recorder = request.config.stash.get(_results_key, None)
    runs = 0

    @functools.wraps(run)
    def recording_run(*args: Any, **kwargs: Any) -> Result:
        nonlocal runs
        result = run(*args, **kwargs)
        for attr, name in names.items():
            node.user_properties.append((f"uffdkvm[{runs}].{name}", getattr(result, attr)))
        runs += 1
        if recorder is not None:
            recorder.write(node.nodeid, result)
        return result

    return recording_run


__all__ = ["COUNTS", "FEATURES", "MARKER", "uffdkvm_host", "uffdkvm_run"]
