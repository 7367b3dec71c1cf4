"""What one experiment measured: :class:`Result` and its per-thread parts.

All types are frozen dataclasses of plain values, defined here in one place.
Units are in the names where a name alone would leave them open.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .config import Config
from .host import HostInfo

NS = 1e-9


@dataclass(frozen=True)
class VcpuStats:
    """One vCPU.

    seconds          from its first KVM_RUN until the guest reported done
    pages            4 KiB pages the guest says it touched (all passes)
    exits            VM exits during the run, from KVM's own "exits" counter
                     (None where the kernel has no binary stats)
    userspace_exits  returns from KVM_RUN to the vCPU thread
    kvm_stats        KVM's own statistics for this vCPU over the run, by the
                     kernel's names: counters as deltas, the rest as they
                     stood at the end (empty without KVM_GET_STATS_FD)
    tid              the host thread that ran it
    """

    index: int
    seconds: float
    pages: int
    exits: Optional[int]
    userspace_exits: int
    tid: int
    kvm_stats: Dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class ReaderStats:
    """One reader thread of one uffd.

    faults            faults this reader resolved
    wakeups           returns from its wait (poll, epoll_wait or read)
    spurious_wakeups  wakeups after which the read found nothing (EAGAIN):
                      another reader took the message
    eexist            faults it found already resolved by another reader
    busy_seconds      from reading a message to its resolving ioctl returning,
                      summed (the per-fault delay included)
    context_switches  times the thread was switched out (getrusage): counts
                      in-kernel herd wakeups that spurious_wakeups cannot see
    cpu_seconds       CPU time the thread used
    """

    uffd: int
    index: int
    faults: int
    wakeups: int
    spurious_wakeups: int
    eexist: int
    busy_seconds: float
    context_switches: int
    cpu_seconds: float


@dataclass(frozen=True)
class Result:
    """One experiment.

    seconds        first vCPU started to last vCPU done
    faults         faults resolved by all readers (EEXIST not counted)
    paging_rate    pages/s as upstream's demand_paging_test computes it:
                   pages_per_vcpu / seconds * vcpus
    verified       every page of the region held what it must after the run,
                   and every vCPU touched and read what it should have
    bad_pages      pages that did not (0 when verified)
    verify_message the first problem found, or "" when verified
    kvm_stats      KVM's VM-wide statistics over the run, like VcpuStats'
    host           the machine it ran on (None for a Result made by hand)
    """

    config: Config
    seconds: float
    pages_per_vcpu: int
    faults: int
    paging_rate: float
    vcpus: List[VcpuStats]
    readers: List[ReaderStats]
    verified: bool
    bad_pages: int
    verify_message: str
    page_size: int
    uffds: int
    kvm_stats: Dict[str, int] = field(default_factory=dict, repr=False)
    host: Optional[HostInfo] = field(default=None, repr=False)

    @property
    def per_vcpu_rate(self) -> float:
        """Upstream's "Per-vcpu demand paging rate", pages/s per vCPU."""
        return self.pages_per_vcpu / self.seconds if self.seconds > 0 else 0.0

    @property
    def eexist(self) -> int:
        return sum(r.eexist for r in self.readers)

    @property
    def spurious_wakeups(self) -> int:
        return sum(r.spurious_wakeups for r in self.readers)

    def to_dict(self) -> dict:
        """Everything as plain JSON-ready types (the config included)."""
        d = dataclasses.asdict(self)
        d["config"] = self.config.to_dict()
        d["per_vcpu_rate"] = self.per_vcpu_rate
        return d

    # Frames and JSON live in frames.py and serial.py; pandas loads on call.
    def to_frame(self):
        """One row: Config fields, results and aggregates (see uffdkvm.frames)."""
        from .frames import run_frame
        return run_frame(self)

    def vcpus_frame(self):
        """One row per vCPU, KVM's statistics as ``kvm_*`` columns."""
        from .frames import vcpus_frame
        return vcpus_frame(self)

    def readers_frame(self):
        """One row per reader thread."""
        from .frames import readers_frame
        return readers_frame(self)

    def to_json(self, **dumps_kwargs) -> str:
        """Everything, losslessly, as one line of JSON (see uffdkvm.serial)."""
        from .serial import to_json
        return to_json(self, **dumps_kwargs)

    @classmethod
    def from_json(cls, text) -> "Result":
        """The Result that :meth:`to_json` wrote: ``Result.from_json(r.to_json()) == r``."""
        from .serial import from_json
        return from_json(cls, text)

    @classmethod
    def _from_core(cls, config: Config, raw: dict) -> "Result":
        vcpus = [VcpuStats(index=v["index"], seconds=(v["end_ns"] - v["start_ns"]) * NS,
                           pages=v["pages"], exits=v["exits"],
                           userspace_exits=v["userspace_exits"], tid=v["tid"],
                           kvm_stats=v["kvm_stats"])
                 for v in raw["vcpus"]]
        readers = [ReaderStats(uffd=r["uffd"], index=r["index"], faults=r["faults"],
                               wakeups=r["wakeups"], spurious_wakeups=r["spurious_wakeups"],
                               eexist=r["eexist"], busy_seconds=r["busy_ns"] * NS,
                               context_switches=r["context_switches"],
                               cpu_seconds=r["cpu_ns"] * NS)
                   for r in raw["readers"]]
        seconds = (raw["end_ns"] - raw["start_ns"]) * NS
        pages = raw["pages_per_vcpu"]
        return cls(
            config=config,
            seconds=seconds,
            pages_per_vcpu=pages,
            faults=sum(r.faults for r in readers),
            paging_rate=pages / seconds * len(vcpus) if seconds > 0 else 0.0,
            vcpus=vcpus,
            readers=readers,
            verified=raw["verified"],
            bad_pages=raw["bad_pages"],
            verify_message=raw["verify_message"],
            page_size=raw["page_size"],
            uffds=raw["uffds"],
            kvm_stats=raw["kvm_stats"],
        )
