"""What this host can run: backings and userfaultfd modes, the ways of
resolving faults, page sources and prefetch policies, probed for real."""
from __future__ import annotations

import tempfile
from pathlib import Path

from .config import (
    BACKING_PAGE_SIZES,
    PREFETCHES,
    RESOLVERS,
    RESOLVES,
    SHARED_BACKINGS,
    WAITS,
    WP_BACKINGS,
    Config,
)
from .errors import UffdkvmError
from .host.facts import usable_cpus_at_import
from .run import probe, run
from .snapshot import make_snapshot

_PROBE_MEM = "64K"   # one vCPU, 16 pages: every probing run


def _attempt(**fields: object) -> str | None:
    """None if a 16-page run with these fields verifies here, else why not."""
    try:
        r = run(Config(vcpus=1, mem_per_vcpu=_PROBE_MEM, **fields))  # type: ignore[arg-type]
    except UffdkvmError as e:
        return str(e)
    return None if r.verified else f"the run did not verify: {r.verify_message}"


def modes_for(backing: str) -> tuple[str | None, ...]:
    """The uffd modes that make sense on a backing (None: no userfaultfd)."""
    modes: tuple[str | None, ...] = ("missing", "minor") if backing in SHARED_BACKINGS \
        else ("missing",)
    return modes + (("wp",) if backing in WP_BACKINGS else ()) + (None,)


def backing_support() -> dict[str, dict[str | None, str | None]]:
    """{backing: {uffd_mode: None if this host runs it, else why not}}.

    Each entry is a real probe (uffdkvm.probe): the VM, one page of the
    backing memory and its uffd are built and registered, then released.
    """
    support: dict[str, dict[str | None, str | None]] = {}
    for backing, page in BACKING_PAGE_SIZES.items():
        support[backing] = {}
        for mode in modes_for(backing):
            try:
                probe(Config(backing=backing, uffd_mode=mode, mem_per_vcpu=page))
                support[backing][mode] = None
            except UffdkvmError as e:
                support[backing][mode] = str(e)
    return support


def fault_path_support() -> dict[str, dict[str, str | None]]:
    """{"wait": {mode: None if it runs here, else why not}, "resolver": {...},
    "resolve": {...}, "source": {...} (source_support), "prefetch": {...}}.

    Each entry is a real run, not a probe: a mode can need what only a run
    shows (readers started, a fault resolved through it). One vCPU demand-
    pages 16 pages through one reader (or itself, for resolver="vcpu"),
    resolved as resolve says (UFFDIO_COPY by default), and must verify;
    "spin_idle", whose readers need a CPU, with the vCPU (and so its reader)
    on the first CPU this process may use.
    """
    pinned = {"spin_idle": {"pin_vcpus": (min(usable_cpus_at_import()),)}}
    return {"wait": {w: _attempt(wait=w, **pinned.get(w, {})) for w in WAITS},
            "resolver": {who: _attempt(resolver=who) for who in RESOLVERS},
            "resolve": {how: _attempt(resolve=how) for how in RESOLVES},
            "source": source_support(),
            "prefetch": {policy: _attempt(prefetch=policy,
                                          replay_from=[0] if policy == "replay" else None)
                         for policy in PREFETCHES}}


def source_support() -> dict[str, str | None]:
    """{page source: None if it runs here, else why not}: "synthetic";
    "file" and "file, cold cache" (a snapshot in the temporary directory,
    whose page cache must be droppable: not on tmpfs); "remote (unix)" and
    "remote (tcp)" (a page server process over each transport).

    Each entry is a real run that must verify, from a 16-page snapshot
    written for it and removed after.
    """
    with tempfile.TemporaryDirectory(prefix="uffdkvm-probe-") as tmp:
        try:
            snapshot = make_snapshot(Path(tmp) / "snapshot.img", _PROBE_MEM, seed=1)
        except (UffdkvmError, OSError) as e:  # no room in the temporary directory, say
            why = f"could not write a snapshot to probe with in {tmp}: {e}"
            return {"synthetic": _attempt(), "file": why, "file, cold cache": why,
                    "remote (unix)": why, "remote (tcp)": why}
        return {"synthetic": _attempt(),
                "file": _attempt(source="file", source_path=snapshot),
                "file, cold cache": _attempt(source="file", source_path=snapshot,
                                             source_cache="cold"),
                "remote (unix)": _attempt(source="remote", source_path=snapshot),
                "remote (tcp)": _attempt(source="remote", source_path=snapshot,
                                         remote_transport="tcp")}
