"""migrate(): a whole live migration, from a Config to a MigrationResult.

Two runs of the core, one after the other in this process:

  the source       Config.migration set (csrc/experiment/migrate.c): pass 1
                   populates, then the guest walks on while its pages cross
                   the modelled link round by round; it stops at a pass's
                   end, sends (precopy) or leaves (postcopy, hybrid) what is
                   still dirty, checks every page the destination holds
                   against its own, and writes its memory at the stop to a
                   private file
  the destination  the same workload on a new VM: the pages the source sent
                   are there before its vCPUs start (Config.preinstall), the
                   rest fault under userfaultfd and come from a page server
                   process serving the source's memory over the same link
                   (remote_bandwidth_mbps, remote_latency_us)

The destination VM is built, and its pre-copied pages put in, before the
switch-over, as a VMM's incoming side is: the downtime counts the source's
stop to the last stop-copy page's arrival, and the destination's vCPU
start (docs/migration.md).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import PAGE_SIZE, Config
from ..errors import ConfigError
from ..result import MigrationRound, Result
from ..run import _config_of, _run
from ..schema import fields as schema

if TYPE_CHECKING:
    import pandas

#: The modes, as Config.migration names them.
MODES = schema.choices("migration")

# The source's guest walks until the sender stops it at a pass's end: its
# passes are a bound, not a count (pass_end_ns holds 8 bytes a pass a vCPU).
_SOURCE_PASSES = 100_000

#: migrate()'s keywords that are the source's Config fields, not the workload's:
#: the link, the rounds, the tracker and the throttle.
KNOBS = ("max_rounds", "downtime_target_ms", "precopy_rounds", "link_bandwidth_mbps",
         "link_latency_us", "dirty_tracking", "dirty_clear_pages", "dirty_ring_entries",
         "auto_converge", "throttle_initial_percent", "throttle_increment_percent",
         "throttle_max_percent")
#: The source's dirty_tracking where none is given.
DEFAULT_TRACKER = "bitmap"
# Fields the source and the destination set for themselves.
_MIGRATION_FIELDS = ("migration", *KNOBS, "migration_dump_path")


@dataclass(frozen=True)
class MigrationResult:
    """A migration's numbers (docs/migration.md).

    mode              "precopy", "postcopy" or "hybrid"
    rounds            the source's pre-copy rounds (MigrationRound: sent_pages,
                      dirty_pages, seconds, dirty_rate); empty for postcopy
    converged         precopy: the rounds ended because the last one's dirty
                      set fit downtime_target_ms on the link, not at
                      max_rounds. The stop comes at the end of the pass the
                      furthest vCPU is in, so the stop-copy (stopcopy_bytes,
                      in the downtime) also holds what was written until
                      then. False for postcopy and hybrid, which stop on
                      no such test
    downtime_seconds  the source's stop (its last vCPU at the end of its
                      pass) to the destination's first KVM_RUN: the
                      stop-copy on the link, its last page's latency, and
                      the destination's vCPU start. vCPUs that reached the
                      stop's pass end earlier waited there before it: that
                      wait is not in it
    total_seconds     round 1's start to the migration's end: the downtime's
                      end for precopy; the last page in at the destination
                      for postcopy and hybrid (None where that was not
                      measured: stats="basic", or pages that never came)
    precopy_bytes     sent while the source ran (all rounds)
    stopcopy_bytes    sent with the source stopped
    postcopy_bytes    fetched by the destination over the link: its page
                      server's bytes sent (faults and background prefetch)
    postcopy_faults   the destination's userfaults (its Result says how long
                      each stage took and the blocktime)
    verified          the source's memory at the stop is what its guest
                      wrote; every page the destination held at the start
                      equals the source's then; the destination's memory at
                      its end is the source's at the stop plus its own
                      guest's writes; and every page reached the destination
    source            the source's Result (Config.migration set)
    destination       the destination's Result
    """

    mode: str
    rounds: tuple[MigrationRound, ...]
    converged: bool
    downtime_seconds: float
    total_seconds: float | None
    precopy_bytes: int
    stopcopy_bytes: int
    postcopy_bytes: int
    postcopy_faults: int
    verified: bool
    source: Result = dataclasses.field(repr=False)
    destination: Result = dataclasses.field(repr=False)

    @property
    def round_count(self) -> int:
        """The pre-copy rounds: len(rounds)."""
        return len(self.rounds)

    @property
    def dirty_rate(self) -> float:
        """The guest's dirty rate as round 1's harvest saw it, 4 KiB pages a
        second (0.0 with no rounds: postcopy)."""
        return self.rounds[0].dirty_rate if self.rounds else 0.0

    @property
    def config(self) -> Config:
        """The source's Config: the workload, the link and the knobs."""
        return self.source.config

    def to_frame(self) -> pandas.DataFrame:
        """One row: the scalars above, the knobs (link_bandwidth_mbps, ...),
        and the source's and destination's Result columns prefixed
        ``source_`` and ``destination_``."""
        from ..io.frames import migration_frame
        return migration_frame(self, KNOBS)

    def rounds_frame(self) -> pandas.DataFrame:
        """One row per pre-copy round (the source's migration_rounds)."""
        from ..io.frames import table_frame
        return table_frame(self.source, "migration_rounds")

    def to_dict(self) -> dict[str, Any]:
        """What to_json writes: the scalars, and both Results' own dicts."""
        out: dict[str, Any] = {f.name: getattr(self, f.name)
                               for f in dataclasses.fields(self)
                               if f.name not in ("rounds", "source", "destination")}
        out["source"] = json.loads(self.source.to_json())
        out["destination"] = json.loads(self.destination.to_json())
        return out

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)


def migrate(config: Config | None = None, *, mode: str = "precopy",
            postcopy_prefetch: str = "background", **fields: Any) -> MigrationResult:
    """Migrate a running guest and return a MigrationResult.

    ``migrate(mode="precopy", vcpus=2, mem_per_vcpu="64M", write_percent=20,
    link_bandwidth_mbps=1000)``: the knobs (KNOBS: max_rounds,
    downtime_target_ms, precopy_rounds, link_bandwidth_mbps, link_latency_us,
    the tracker's dirty_tracking, dirty_clear_pages, dirty_ring_entries, and
    auto_converge with its throttle_initial_percent, throttle_increment_percent
    and throttle_max_percent)
    are keywords; the rest of the keywords and ``config`` are the workload,
    which runs on a source VM
    whose pages cross a link of that bandwidth round by round (dirty_tracking
    finds what each round must resend; default "bitmap"), then on a
    destination VM that walks its memory ``passes`` times after the
    switch-over. ``postcopy_prefetch`` is the destination's Config.prefetch
    for what it does not hold: "background" streams it (behind the faults,
    which go first), "none" fetches only what faults. Both VMs' memory is
    verified; the source's memory at the stop lives in a private temporary
    directory (guest memory), removed on every way out.
    """
    if "migration" in fields:
        raise ConfigError("migration: migrate() sets it for the source; pass mode= instead",
                          field="migration")
    knobs = {name: fields.pop(name) for name in KNOBS if name in fields}
    return _migrate(_config_of(config, fields), mode, knobs, postcopy_prefetch)


def _migrate(base: Config, mode: str, knobs: dict[str, Any],
             postcopy_prefetch: str = "background", **source_core_fields: Any) -> MigrationResult:
    """migrate() for a workload and the knobs; source_core_fields go to the
    source's core as they are (tests inject failures this way, see
    uffdkvm.testing._faults)."""
    if mode not in MODES:
        raise ConfigError(f"mode: {mode!r} is not one of {', '.join(map(repr, MODES))}",
                          field="mode")
    _check_workload(base)
    # mkdtemp makes it 0700: the memory at the stop is guest memory.
    workdir = tempfile.mkdtemp(prefix="uffdkvm-migrate-")
    try:
        dump = os.path.join(workdir, "memory-at-stop")
        source = _run(_source_config(base, mode, knobs, dump), **source_core_fields)
        destination = _run(_destination_config(base, dump, source, postcopy_prefetch))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return _result(mode, source, destination)


def _check_workload(c: Config) -> None:
    if c.migration is not None:
        raise ConfigError("migration: migrate() sets it for the source; pass mode= instead",
                          field="migration")
    if c.backing not in schema.backings_where("migrates"):
        raise ConfigError(f"backing: migrate() moves 4 KiB pages, and {c.backing!r} does "
                          f"not fault in them; use backing="
                          f"{schema.listed(schema.backings_where('migrates'))}",
                          field="backing")
    if c.source != "synthetic":
        raise ConfigError("source: migrate() gives the destination its own page source (the "
                          "source VM's memory); leave source='synthetic'", field="source")


def _source_config(base: Config, mode: str, knobs: dict[str, Any], dump: str) -> Config:
    """The workload on the source: its own memory (no userfaultfd), a tracker
    for the rounds, and passes that bound the walk."""
    knobs = {"dirty_tracking": base.dirty_tracking or DEFAULT_TRACKER, **knobs}
    return base.replace(uffd_mode=None, passes=_SOURCE_PASSES, migration=mode,
                        migration_dump_path=dump, prefetch="none", **knobs)


def _destination_config(base: Config, dump: str, source: Result,
                        postcopy_prefetch: str) -> Config:
    """The workload on the destination: the pages the source sent present
    from the start, the rest from a page server over the link."""
    link = {"remote_bandwidth_mbps": source.config.link_bandwidth_mbps,
            "remote_latency_us": source.config.link_latency_us}
    defaults = {name: schema.BY_NAME[name].default for name in _MIGRATION_FIELDS
                if name != "dirty_tracking"}
    held = source.migrated_pages
    everything = len(held) == base.region_bytes // PAGE_SIZE
    page_source: dict[str, Any] = {"source": "file"} if everything else \
        {"source": "remote", "prefetch": postcopy_prefetch, **link}
    return base.replace(**defaults, uffd_mode="missing", resolve="copy", dirty_tracking=None,
                        source_path=dump, preinstall=held or None, **page_source)


def _result(mode: str, source: Result, destination: Result) -> MigrationResult:
    c = source.config
    latency = c.link_latency_us * 1e-6
    downtime = (source.stopcopy_seconds or 0.0) + latency + (destination.startup_seconds or 0.0)
    region_pages = c.region_bytes // PAGE_SIZE
    # Every page in: the destination's resident map saw its last page go in
    # (resident_seconds is set then only), and the counts agree with it.
    arrived = len(source.migrated_pages) + destination.faults + \
        (destination.prefetched_pages or 0)
    all_in = destination.resident_seconds is not None and arrived == region_pages
    total: float | None = (source.precopy_seconds or 0.0) + downtime
    if mode != "precopy":
        # The last page's arrival; unmeasured (stats basic, or pages that never came): None.
        total = total + destination.resident_seconds if all_in else None  # type: ignore[operator]
    server = destination.page_server
    return MigrationResult(
        mode=mode, rounds=source.migration_rounds,
        converged=bool(source.migration_converged), downtime_seconds=downtime,
        total_seconds=total,
        precopy_bytes=(source.precopy_pages or 0) * PAGE_SIZE,
        stopcopy_bytes=(source.stopcopy_pages or 0) * PAGE_SIZE,
        postcopy_bytes=server.bytes if server is not None else 0,
        postcopy_faults=destination.faults,
        verified=source.verified and destination.verified and destination.contents_verified
        and all_in,
        source=source, destination=destination)
