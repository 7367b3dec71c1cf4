"""What this host can run: backings and userfaultfd modes, probed for real."""
from __future__ import annotations

from .config import BACKING_PAGE_SIZES, SHARED_BACKINGS, Config
from .errors import UffdkvmError
from .run import probe


def modes_for(backing: str) -> tuple[str | None, ...]:
    """The uffd modes that make sense on a backing (None: no userfaultfd)."""
    return ("missing", "minor", None) if backing in SHARED_BACKINGS else ("missing", None)


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
