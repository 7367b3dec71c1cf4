"""What this host can run: backings and userfaultfd modes, and the ways of
resolving faults, probed for real."""
from __future__ import annotations

from .config import (
    BACKING_PAGE_SIZES,
    RESOLVERS,
    RESOLVES,
    SHARED_BACKINGS,
    WAITS,
    WP_BACKINGS,
    Config,
)
from .errors import UffdkvmError
from .run import probe, run


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
    "resolve": {...}}.

    Each entry is a real run, not a probe: a mode can need what only a run
    shows (readers started, a fault resolved through it). One vCPU demand-
    pages 16 pages through one reader (or itself, for resolver="vcpu"),
    resolved as resolve says (UFFDIO_COPY by default), and must verify.
    """
    def attempt(**fields: object) -> str | None:
        try:
            r = run(Config(vcpus=1, mem_per_vcpu="64K", **fields))  # type: ignore[arg-type]
        except UffdkvmError as e:
            return str(e)
        return None if r.verified else f"the run did not verify: {r.verify_message}"

    return {"wait": {w: attempt(wait=w) for w in WAITS},
            "resolver": {who: attempt(resolver=who) for who in RESOLVERS},
            "resolve": {how: attempt(resolve=how) for how in RESOLVES}}
