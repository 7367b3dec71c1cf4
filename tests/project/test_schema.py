"""uffdkvm/schema/fields.py is the one declaration of every config field (and
uffdkvm/schema/results.py of every result value: tests/results/test_fields.py).

- Each file generated from either is current (Argument Clinic's model: a
  stale one fails here, naming the file and the one command that rewrites
  every one, tools/gen_schema.py).
- The binding requires every core field and refuses any other key.
- Every core field reaches the core: a run with a value other than the
  default shows an effect in what the core measured (for all but a few),
  and the core's own copy of its config (raw["config"]) holds it.
- Every refusal of the one validator names a real field first, so
  ConfigError.field is set for each.
"""
import importlib
import importlib.util
import os
import re
from pathlib import Path

import pytest

import uffdkvm
from helpers.hostfacts import NO_STEADY_KVM_TSC_OFFSET
from uffdkvm import Config, ConfigError, _core
from uffdkvm.schema import faults as schema_faults, fields as schema
from uffdkvm.config import core_config

# The module, not the function uffdkvm re-exports under the same name.
run_module = importlib.import_module("uffdkvm.run")

ROOT = Path(__file__).resolve().parents[2]


# ---- the generated files ----

def load_generator():
    """tools/gen_schema.py, the one command that writes every generated file,
    loaded by its path (tools/ is no package)."""
    spec = importlib.util.spec_from_file_location("gen_schema", ROOT / "tools" / "gen_schema.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_schema = load_generator()
GENERATED = ("csrc/config_schema.h", "uffdkvm/config.py", "uffdkvm/_core.pyi", "docs/config.md",
             "csrc/result_schema.h", "uffdkvm/result.py", "docs/results.md",
             "csrc/testhooks.h")


def test_the_generator_writes_each_generated_file():
    assert sorted(gen_schema.generated(ROOT)) == sorted(GENERATED)


@pytest.mark.parametrize("path", GENERATED)
def test_each_generated_file_is_current(path):
    expected = gen_schema.generated(ROOT)[path]
    actual = (ROOT / path).read_text(encoding="utf-8")
    assert actual == expected, f"{path} is stale: run {gen_schema.COMMAND}"


def test_a_stale_file_is_named(tmp_path):
    """The check itself: a tree whose generated files were edited by hand
    (a member's comment, a field's docstring) is stale, file by file."""
    for path in GENERATED:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(gen_schema.generated(ROOT)[path], encoding="utf-8")
    assert gen_schema.stale(tmp_path) == []
    header = tmp_path / "csrc/result_schema.h"
    header.write_text(header.read_text().replace("uint64_t wakes;", "uint64_t wakes_; "))
    result = tmp_path / "uffdkvm/result.py"
    result.write_text(result.read_text().replace("    wakes: int = 0\n", ""))
    assert gen_schema.stale(tmp_path) == ["csrc/result_schema.h", "uffdkvm/result.py"]


def test_the_command_is_named_where_contributors_read():
    """Every place that tells a contributor how to regenerate names the one
    command (a module that has no __main__ once stood there)."""
    for path in ("csrc/ukvm.h", "docs/config.md", "docs/results.md", "docs/development.md",
                 "csrc/README.md", "uffdkvm/schema/fields.py", "uffdkvm/schema/results.py",
                 "uffdkvm/schema/faults.py"):
        text = (ROOT / path).read_text(encoding="utf-8")
        assert "python -m uffdkvm.schema" not in text, path
        assert gen_schema.COMMAND in text, path


def test_the_extension_exports_the_schemas_constants():
    """add_constants walks the X-macros: each enum value and limit is there
    with the schema's value (the enum's position in its choices)."""
    for f in schema.CORE_FIELDS:
        for i, choice in enumerate(f.choices):
            assert getattr(_core, f"{f.enum_prefix}_{choice.upper()}") == i
    for name, value, _ in schema.CONSTANTS:
        assert getattr(_core, name) == value, name
    assert _core.MAX_ZIPF_THETA == schema.MAX_ZIPF_THETA
    # The fault injections, in a build with them (uffdkvm/schema/faults.py).
    injects = {n: getattr(_core, n) for n in dir(_core) if n.startswith("INJECT_")}
    if _core.TEST_HOOKS:
        assert injects == {f"INJECT_{f.c_name}": i + 1
                           for i, f in enumerate(schema_faults.FAULTS)}
    else:
        assert injects == {}


def test_config_is_the_schemas():
    import dataclasses
    fields = dataclasses.fields(Config)
    assert [f.name for f in fields] == [f.name for f in schema.CONFIG_FIELDS]
    assert [f.default for f in fields] == [f.default for f in schema.CONFIG_FIELDS]
    for f in schema.CONFIG_FIELDS:
        assert f"    {f.name}  (default" in Config.__doc__, f.name


@pytest.mark.parametrize("flag,field", [("--wait", "wait"), ("--prefetch", "prefetch"),
                                        ("--source", "source"), ("--stats", "stats")])
def test_the_clis_choices_are_the_schemas(flag, field, capsys):
    """The CLI's choices come from the schema: a bad value's error lists them."""
    import argparse

    from uffdkvm.cli import _common as cli_common
    p = argparse.ArgumentParser()
    cli_common.add_run_arguments(p, lambda convert: convert, "")
    with pytest.raises(SystemExit):
        p.parse_args([flag, "bogus"])
    err = capsys.readouterr().err
    assert ", ".join(map(repr, schema.choices(field))) in err, err


def run_flag_parsers():
    """Every command that takes the run flags, by name: its parser."""
    import argparse

    from uffdkvm.cli import dirty_log as cli_dirty
    from uffdkvm.cli import kernel as cli_kernel
    from uffdkvm.cli import migrate as cli_migrate
    from uffdkvm.cli import run as cli_run
    from uffdkvm.cli import sweep as cli_sweep
    kernel = cli_kernel.build_parser()
    sub = next(a for a in kernel._actions if isinstance(a, argparse._SubParsersAction))
    return {"uffdkvm": cli_run.build_parser(), "uffdkvm sweep": cli_sweep.build_parser(),
            "uffdkvm dirty-log": cli_dirty.build_parser(),
            "uffdkvm migrate": cli_migrate.build_parser(),
            **{f"uffdkvm kernel {name}": sub.choices[name] for name in ("run", "sweep", "compare")}}


@pytest.mark.parametrize("command", list(run_flag_parsers()))
def test_every_field_is_a_flag_of_every_command_that_takes_run_flags(command):
    """The run flags are built from the schema (cli_common.add_field_arguments):
    each Config field whose entry makes it a run flag (Field.cli "run") is
    one, under its entry's option strings, with its range and default in the
    help. dirty-log puts upstream's letters over some (-a, -r, -b, -o, -u) and
    gives the fields long options of its own. A field whose entry names
    subcommands instead is a flag of those, built from the entry too; one
    with none says where it is set (Field.cli_why)."""
    p = run_flag_parsers()[command]
    by_dest, by_option = {}, {}
    for a in p._actions:
        by_dest.setdefault(a.dest, []).append(a)
        by_option.update(dict.fromkeys(a.option_strings, a))
    for f in schema.CONFIG_FIELDS:
        assert f.cli or f.cli_why, f"{f.name}: no flag, and no word of where it is set"
        assert set(f.cli) <= {"run", *schema.CLI_COMMANDS}, f.name
        if not f.run_flag:
            if command.split()[-1] in f.cli:
                a = by_option[f.option_strings[0]]
                assert a.help.startswith(f.doc.replace("%", "%%")), f.name
            else:
                assert f.name not in by_dest, f"{command} has a flag for {f.name}"
            continue
        assert f.name in by_dest, f"{command} has no flag for {f.name}"
        if command == "uffdkvm dirty-log":
            continue
        (a,) = by_dest[f.name]
        assert tuple(a.option_strings) == f.option_strings, f.name
        if f.min is not None and f.kind not in ("cpus", "double"):
            assert f"{f.min}-{f.max}" in a.help, (f.name, a.help)
        if f.default is not None and f.kind != "bool":
            assert f"default {schema.python_repr(f, f.default).strip(chr(39))}" in a.help


@pytest.mark.parametrize("backing", list(schema.BACKING_PAGE_SIZES))
def test_the_cores_page_sizes_are_the_schemas(backing):
    """The validator's unit for mem_per_vcpu is the schema's page size of
    the backing (backing.c's table is generated from it), and the guest
    page sizes it takes are the schema's."""
    size = schema.BACKING_PAGE_SIZES[backing]
    d = {**core_config(Config(mem_per_vcpu="64K")),
         "backing": getattr(_core, f"BACKING_{backing.upper()}"), "mem_per_vcpu": size}
    assert _core.validate(d) is None
    with pytest.raises(_core.CoreError, match=f"mem_per_vcpu: must be a positive multiple "
                       f"of {size} "):
        _core.validate({**d, "mem_per_vcpu": size + size // 2 if size > 4096 else 6144})
    for name, guest in schema.GUEST_PAGE_SIZES.items():
        assert _core.validate({**d, "guest_page_size": guest, "mem_per_vcpu": max(size, guest)}) \
            is None, name
    with pytest.raises(_core.CoreError, match="guest_page_size: must be '4K', '2M' or '1G'"):
        _core.validate({**d, "guest_page_size": 8192})


@pytest.mark.parametrize("backing", schema.BACKINGS, ids=lambda b: b.name)
def test_the_cores_backing_properties_are_the_schemas(backing):
    """The core's validator reads each backing's properties from the
    schema's table (UKVM_BACKINGS): minor faults where it is shared, uffd-wp
    where wp, UFFDIO_MOVE where private anonymous, zeropage where not hugetlb."""
    base = {**core_config(Config(mem_per_vcpu="64K")),
            "backing": getattr(_core, f"BACKING_{backing.name.upper()}"),
            "mem_per_vcpu": backing.page_size}
    cases = (("shared", {"uffd_mode": _core.UFFD_MINOR}, "uffd_mode: 'minor' needs"),
             ("wp", {"uffd_mode": _core.UFFD_WP}, "uffd_mode: 'wp' runs on"),
             ("private_anonymous", {"resolve": _core.RESOLVE_MOVE}, "resolve: 'move' needs"),
             ("hugetlb", {"resolve": _core.RESOLVE_ZEROPAGE}, "resolve: 'zeropage' does not"))
    for prop, change, refusal in cases:
        try:
            _core.validate({**base, **change})
            refused = ""
        except _core.CoreError as e:
            refused = str(e)
        says = getattr(backing, prop) if prop != "hugetlb" else not backing.hugetlb
        assert (refusal not in refused) == says, (prop, refused)


# ---- the binding: every key, no other ----

def test_the_binding_refuses_a_missing_key():
    for f in schema.CORE_FIELDS:
        d = core_config(Config(mem_per_vcpu="64K"))
        del d[f.core_name]
        for call in (_core.validate, _core.probe, _core.run):
            with pytest.raises(KeyError, match=f"{f.core_name}: missing"):
                call(d)


def test_the_binding_refuses_an_unknown_key():
    d = core_config(Config(mem_per_vcpu="64K"))
    for call in (_core.validate, _core.probe, _core.run):
        with pytest.raises(KeyError, match="reader: not a field of the core's config"):
            call({**d, "reader": 4})
    # A Config field the core does not take is not one of its keys either.
    with pytest.raises(KeyError, match="remote_latency_us: not a field"):
        _core.validate({**d, "remote_latency_us": 0})


def test_validate_is_the_cores_validator():
    d = core_config(Config(mem_per_vcpu="64K"))
    assert _core.validate(d) is None
    with pytest.raises(_core.CoreError) as info:
        _core.validate({**d, "readers": 2, "resolver": _core.RESOLVER_VCPU})
    kind, _, message = info.value.args
    assert kind == _core.ERR_CONFIG
    assert message.startswith("readers: applies to resolver='readers' only"), message


# ---- every field reaches the core ----

SMALL = dict(mem_per_vcpu="64K")


def in_order(trace, column="gpa", by="read_ns"):
    """A fault-trace column in the order of another (the readers' read stamps)."""
    return [v for _, v in sorted(zip(trace[by], trace[column], strict=True))]


def rerun(**fields):
    """The core's raw result of another small run, through the same mapping,
    for the checks that compare with a baseline."""
    return _core.run(run_module._core_config(Config(**{**SMALL, **fields}), None))


def bytes_read(**fields):
    """What a small run's threads passed through read(2) and pread(2): the
    kernel's count (/proc/self/io rchar, which keeps exited threads')."""
    def rchar():
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
    before = rchar()
    rerun(**fields)
    return rchar() - before


def median_gap_ns(raw):
    """The guest's median time from one access completing to the next one
    being raised (guest_timing stamps): the computation in between."""
    t = sorted(zip(raw["fault_trace"]["raised_ns"], raw["fault_trace"]["resumed_ns"], strict=True))
    gaps = sorted(b[0] - a[1] for a, b in zip(t, t[1:], strict=False))
    return gaps[len(gaps) // 2]


def cases(snapshot):
    """For each core field: the Config fields of a run with a value other
    than its default (valid in its context), and a check of an effect the
    run reports (or None). Each check reads something the core measured
    (the readers' and vCPUs' counters, the fault trace, the guest's own
    counts), never the config: forcing the field to its default in
    core_config() makes it fail."""
    cpus = sorted(os.sched_getaffinity(0))
    timed = dict(guest_timing=True, trace_faults=True)
    file_4m = dict(source="file", source_path=snapshot, mem_per_vcpu="4M")
    # A migration's source: its own memory, a tracker, and the memory at the stop beside the snapshot.
    dump = os.path.join(os.path.dirname(snapshot), "memory-at-stop")
    source = dict(uffd_mode=None, passes=1000, dirty_tracking="bitmap", write_percent=100,
                  migration_dump_path=dump)
    # Rounds that crawl (16 pages at 8 Mbit/s: 64 ms), in which even a guest
    # under TCG rewrites every page: round 1 always finds some dirty.
    crawling = dict(source, passes=100_000, migration="precopy", link_bandwidth_mbps=8)
    throttled = dict(crawling, auto_converge=True, downtime_target_ms=0, max_rounds=3)
    return {
        "vcpus": (dict(vcpus=2), lambda raw: len(raw["vcpus"]) == 2),
        "mem_per_vcpu": (dict(mem_per_vcpu="128K"), lambda raw: raw["region_bytes"] == 128 << 10),
        "backing": (dict(backing="shmem"), None),
        # UFFDIO_CONTINUE resolved them: minor faults.
        "uffd_mode": (dict(uffd_mode="minor", backing="shmem"),
                      lambda raw: raw["readers"][0]["continues"] == raw["faults"] > 0),
        "single_uffd": (dict(vcpus=2, single_uffd=True), lambda raw: raw["uffds"] == 1),
        "resolver": (dict(resolver="vcpu"),
                     lambda raw: raw["vcpus"][0]["fault_exits"] > 0),
        "readers": (dict(readers=2), lambda raw: len(raw["readers"]) == 2),
        # A spinning reader never sleeps; a waiting one sleeps about once a fault.
        "wait": (dict(wait="spin"),
                 lambda raw: raw["readers"][0]["voluntary_context_switches"] < raw["faults"] / 2),
        # Four vCPUs queue faults on one uffd while its reader delays: a
        # read returns several only when read_batch lets it.
        "read_batch": (dict(vcpus=4, single_uffd=True, read_batch=4, delay_us=500),
                       lambda raw: sum(raw["readers"][0]["read_sizes"][2:]) > 0),
        "delay_us": (dict(delay_us=2000),
                     lambda raw: raw["readers"][0]["service_latency"]["min"] >= 2_000_000),
        "overlap": (dict(vcpus=2, overlap=True),
                    lambda raw: raw["uffds"] == 1 and raw["region_bytes"] == 64 << 10),
        # The guest computes between accesses: the gaps grow far past a run
        # without work's (10^4 iterations: 2 us at the very least). Only the
        # guest's stamps show them: where KVM moves the guest's TSC offset they
        # are on no clock, and the core's own copy of the field is the check.
        "guest_work": (dict(guest_work=10_000, **timed),
                       None if NO_STEADY_KVM_TSC_OFFSET.holds else
                       lambda raw: median_gap_ns(raw) >
                       max(2000, 2 * median_gap_ns(rerun(**timed)))),
        "guest_page_size": (dict(mem_per_vcpu="2M", guest_page_size="2M"), None),
        "pattern": (dict(pattern="reverse", trace_faults=True),
                    lambda raw: in_order(raw["fault_trace"]) ==
                    sorted(raw["fault_trace"]["gpa"], reverse=True)),
        # Two seeds, two permutations.
        "seed": (dict(seed=5, pattern="random", trace_faults=True),
                 lambda raw: in_order(raw["fault_trace"]) !=
                 in_order(rerun(pattern="random", trace_faults=True)["fault_trace"])),
        "write_percent": (dict(write_percent=50, trace_faults=True),
                          lambda raw: 0 < sum(raw["fault_trace"]["write"]) <
                          len(raw["fault_trace"]["write"])),
        "passes": (dict(passes=2), lambda raw: raw["passes"] == 2),
        "resolve": (dict(resolve="zeropage"),
                    lambda raw: raw["readers"][0]["zeropages"] == raw["faults"] > 0 and
                    raw["readers"][0]["copies"] == 0),
        # Uniform on 0..2 x delay_us: some fault is served in less than the
        # fixed delay every fault would wait.
        "delay_dist": (dict(delay_us=1000, delay_dist="uniform"),
                       lambda raw: raw["readers"][0]["service_latency"]["min"] < 1_000_000),
        "pin_vcpus": (dict(pin_vcpus=[cpus[-1]]),
                      lambda raw: len(cpus) < 2 or raw["vcpus"][0]["cpus"] == [cpus[-1]]),
        "pin_readers": (dict(pin_readers=[cpus[0]]),
                        lambda raw: len(cpus) < 2 or raw["readers"][0]["cpus"] == [cpus[0]]),
        "prefault": (dict(prefault=True), lambda raw: raw["faults"] == 0),
        "stats": (dict(stats="basic"), lambda raw: not raw["stats_full"]),
        # The stages only the guest's stamps give.
        # (Where KVM moves the guest's TSC offset there are none, and the run says why.)
        "guest_timing": (dict(guest_timing=True),
                         lambda raw: raw["vcpus"][0]["access_cycles"] > 0 and
                         (raw["vcpus"][0]["queue_latency"]["count"] > 0 or
                          raw["clock_sync_message"].startswith("KVM's TSC offset of vCPU"))),
        "trace_faults": (dict(trace_faults=True), lambda raw: raw["fault_trace"] is not None),
        "record_touch_order": (dict(record_touch_order=True),
                               lambda raw: len(raw["touch_order"]) == raw["faults"] > 0),
        "timeout_ns": (dict(timeout_s=100.0), None),
        "wp_async": (dict(uffd_mode="wp", wp_async=True),
                     lambda raw: raw["faults"] == 0 and raw["dirty_pages"] > 0),
        "source": (dict(source="file", source_path=snapshot),
                   lambda raw: raw["readers"][0]["source_bytes"] > 0),
        "source_path": (dict(source="file", source_path=snapshot),
                        lambda raw: raw["readers"][0]["source_bytes"] > 0),
        "source_address": (dict(source="remote", source_path=snapshot),
                           lambda raw: raw["readers"][0]["source_bytes"] > 0),
        # run()'s server's fresh key: without it every reader's connect is refused.
        "source_key_file": (dict(source="remote", source_path=snapshot),
                            lambda raw: raw["readers"][0]["source_bytes"] > 0),
        # Copied from a mapping, not pread(2): a 4 MiB region's bytes fewer
        # through read calls than the same run with pread's.
        "source_read": (dict(source="file", source_path=snapshot, source_read="mmap"),
                        lambda raw: bytes_read(**file_4m, source_read="mmap") + (2 << 20) <
                        bytes_read(**file_4m)),
        # mincore as the vCPUs start: dropped (the file was just written: warm).
        "source_cache": (dict(source="file", source_path=snapshot, source_cache="cold",
                              mem_per_vcpu="4M"),
                         lambda raw: raw["source_cached_pages_at_start"] <
                         raw["pages_per_vcpu"] // 2),
        "touch_percent": (dict(touch_percent=50),
                          lambda raw: 0 < raw["touched_pages"] < raw["pages_per_vcpu"]),
        # Zipf draws repeat pages: fewer distinct ones than accesses.
        "access": (dict(access="zipf", zipf_theta=0.99),
                   lambda raw: raw["touched_pages"] < raw["guest_accesses"]),
        # More skew, fewer distinct pages than the usual 0.99's.
        "zipf_theta": (dict(access="zipf", zipf_theta=1.5),
                       lambda raw: raw["touched_pages"] <
                       rerun(access="zipf", zipf_theta=0.99)["touched_pages"]),
        "accesses": (dict(access="zipf", zipf_theta=0.99, accesses=7),
                     lambda raw: raw["guest_accesses"] == 7),
        # Each fault delayed 2 ms: the pusher gets to some of the 16 pages first.
        "prefetch": (dict(prefetch="background", delay_us=2000),
                     lambda raw: raw["pushed_pages"] > 0),
        # Each fault brings at most prefetch_pages more (the default 8 would
        # bring 7 for every fault of this region's 16 pages).
        "prefetch_pages": (dict(prefetch="readahead", prefetch_pages=3),
                           lambda raw: 0 < raw["prefetched_pages"] <= 3 * raw["faults"]),
        # At 2 Mbit/s a 4 KiB page takes 16 ms: the vCPU faults in most
        # pages before the pusher gets to them (unlimited, it wins them all).
        "prefetch_bandwidth_mbps": (dict(prefetch="background", prefetch_bandwidth_mbps=2),
                                    lambda raw: raw["pushed_pages"] < raw["pages_per_vcpu"]),
        # Each fault held 5 ms, so that the pusher has its 3 pages in before
        # the vCPU gets there (without, a busy machine's vCPU won the race once).
        "replay": (dict(prefetch="replay", replay_from=[3, 1, 2], delay_us=5000),
                   lambda raw: raw["pushed_pages"] == 3),
        # Half of the 16 pages there before the vCPUs: only the other half faults.
        "preinstall": (dict(source="file", source_path=snapshot, preinstall=range(8)),
                       lambda raw: raw["faults"] == 8 and raw["preinstalled_pages"] == 8),
        # Tracked passes at all: one record for each pass after the first.
        "dirty_tracking": (dict(dirty_tracking="bitmap", passes=3),
                           lambda raw: len(raw["dirty_passes"]) == 2),
        # Each pass its own pages: the counts move (fixed: the same pages each pass).
        "write_set": (dict(write_set="per_pass", write_percent=50, passes=6, mem_per_vcpu="1M",
                           dirty_tracking="bitmap"),
                      lambda raw: len({p["written_pages"] for p in raw["dirty_passes"]}) > 1),
        # 256 pages cleared 64 at a time: four KVM_CLEAR_DIRTY_LOGs (0: one).
        "dirty_clear_pages": (dict(dirty_tracking="bitmap_manual", passes=2,
                                   dirty_clear_pages=64, mem_per_vcpu="1M"),
                              lambda raw: raw["dirty_passes"][0]["reprotect_calls"] == 4),
        # Some 1000 writes into 512 entries fill the ring (4096 would not fill).
        "dirty_ring_entries": (dict(dirty_tracking="ring", passes=2, dirty_ring_entries=512,
                                    mem_per_vcpu="8M", write_percent=50),
                               lambda raw: raw["dirty_passes"][0]["ring_full_exits"] > 0),
        # The source's rounds at all (None: an ordinary run has none).
        "migration": (dict(**source, migration="precopy"),
                      lambda raw: len(raw["migration_rounds"]) >= 1),
        # A target no dirty set meets: the rounds run to the bound (30 by default).
        "max_rounds": (dict(**crawling, downtime_target_ms=0, max_rounds=2),
                       lambda raw: len(raw["migration_rounds"]) == 2),
        # 0 ms: every page written since its send is too many (300 ms fits them).
        "downtime_target_ms": (dict(**crawling, downtime_target_ms=0, max_rounds=2),
                               lambda raw: not raw["migration_converged"]),
        "precopy_rounds": (dict(**source, migration="hybrid", precopy_rounds=3),
                           lambda raw: len(raw["migration_rounds"]) == 3),
        # At 8 Mbit/s a 4 KiB page takes 4 ms of the link: round 1's 16 take 64 ms.
        "link_bandwidth_mbps": (dict(**source, migration="precopy", link_bandwidth_mbps=8),
                                lambda raw: raw["migration_rounds"][0]["send_ns"] >=
                                16 * 4_000_000),
        # A latency past the target: nothing fits, whatever is dirty.
        "link_latency_us": (dict(**source, migration="precopy", link_latency_us=400_000,
                                 max_rounds=1),
                            lambda raw: not raw["migration_converged"]),
        "migration_dump_path": (dict(**source, migration="postcopy"),
                                lambda raw: os.path.getsize(dump) == raw["region_bytes"]),
        # Every page rewritten while a 64 ms round crawls (8 Mbit/s): each
        # round's dirty set is over half of what it sent, so each throttles
        # further: round 2 at the initial percent, round 3 one increment up.
        "auto_converge": (dict(**throttled),
                          lambda raw: raw["migration_rounds"][1]["throttle_percent"] == 20 and
                          all(v["throttled_ns"] > 0 for v in raw["vcpus"])),
        "throttle_initial_percent": (dict(**throttled, throttle_initial_percent=40),
                                     lambda raw: raw["migration_rounds"][1]
                                     ["throttle_percent"] == 40),
        "throttle_increment_percent": (dict(**throttled, throttle_increment_percent=30),
                                       lambda raw: raw["migration_rounds"][2]
                                       ["throttle_percent"] == 50),
        "throttle_max_percent": (dict(**throttled, throttle_max_percent=25),
                                 lambda raw: raw["migration_rounds"][2]
                                 ["throttle_percent"] == 25),
    }


def expected(f, config, server):
    """What the core's copy must hold for field f: the Config's value in the
    core's form (the derived one for pin_readers and timeout_s)."""
    if f.name == "source_address":
        return server.address
    if f.name == "source_key_file":
        return server.key_file
    if f.form == "pin_readers":
        return list(config.reader_cpus)
    if f.form == "seconds":
        return schema.to_core_value(f, config.effective_timeout_s)
    return schema.to_core_value(f, getattr(config, f.name))


def generic_case(f):
    """A field without a case of its own: the schema's next value after its
    default (a number one more, within its range; a flag flipped; an enum's
    next choice). If that is not valid alone, the field needs a case above."""
    if f.kind == "bool":
        return {f.name: not f.default}
    if f.kind == "enum":
        return {f.name: schema.python_value(f, f.choices[(f.core_default + 1) % len(f.choices)])}
    if f.kind in ("u32", "u64"):
        value = (f.default or 0) + 1
        return {f.name: value if f.max is None or value <= f.max else f.default - 1}
    raise AssertionError(f"{f.name}: give it a case in cases()")


@pytest.mark.parametrize("name", [f.core_name for f in schema.CORE_FIELDS])
def test_every_core_field_reaches_the_core(kvm, snapshot, name):
    """Through run.py's mapping and the binding: the core's own copy holds
    the value; a key forced to its default on the way fails here."""
    f = schema.BY_CORE_NAME[name]
    fields, effect = cases(snapshot).get(name) or (generic_case(f), None)
    config = Config(**{**SMALL, **fields})
    if name == "wait" and config.wait == "io_uring" and not _core.HAVE_IO_URING:
        pytest.skip("a build without liburing")
    with run_module._page_server(config) as server:
        try:
            raw = _core.run(run_module._core_config(config, server))
        except _core.CoreError as e:
            if e.args[0] == _core.ERR_HOST:
                pytest.skip(f"this host: {e.args[2]}")
            raise
        want = expected(f, config, server)
    assert want != f.core_default, f"{name}: the case must leave the default"
    # The effect first: forced to its default on the way, the field fails here.
    if effect is not None:
        assert effect(raw), f"{name}: the run shows no effect of {fields}"
    assert raw["config"][name] == want, (name, raw["config"][name], want)
    # Every other field as the mapping gave it, too.
    sent = run_module._core_config(config, server)
    for other in schema.CORE_FIELDS:
        if other.core_name != "source_address":
            assert raw["config"][other.core_name] == sent[other.core_name], other.core_name


# ---- every refusal names a field ----

CONFIG_C = ROOT / "csrc" / "experiment" / "config.c"


def test_every_message_of_the_validator_starts_with_a_field():
    """Each BAD(...) of config.c: its format starts with a schema field's
    name and ": ", or with "%s: " fed the field's name (the generic pass)."""
    text = CONFIG_C.read_text()
    formats = re.findall(r'BAD\(\s*"([^"]*)"', text)
    assert len(formats) > 25, formats
    names = {f.name for f in schema.FIELDS}
    for fmt in formats:
        head = fmt.partition(":")[0]
        assert head == "%s" or head in names or head == "inject", fmt  # inject: test hooks
    # ukvm_err_set(err, UKVM_ERR_CONFIG, ...) outside BAD: the same rule.
    for fmt in re.findall(r'ukvm_err_set\(err, UKVM_ERR_CONFIG, 0,\s*"([^"]*)"', text):
        assert fmt.partition(":")[0] in names | {"%s"}, fmt


def bad_changes():
    """A large sample of refused core configs, by construction: each field's
    range overstepped (and an enum's count), each applies rule broken, each
    hand-written rule between fields."""
    out = []
    migrating = {"migration": _core.MIGRATION_PRECOPY, "uffd_mode": _core.UFFD_NONE,
                 "passes": 2, "dirty_tracking": _core.DIRTY_BITMAP,
                 "migration_dump_path": "/x"}
    for f in schema.CORE_FIELDS:
        if f.kind in ("u32", "u64") and f.max is not None:
            out.append({f.core_name: f.max + 1})
            if f.min and f.form != "optional":  # optional: the core's 0 is None
                out.append({f.core_name: f.min - 1})
        if f.kind == "enum":
            out.append({f.core_name: len(f.choices)})
        if f.kind == "double":
            out.append({f.core_name: f.max * 2, "access": _core.ACCESS_ZIPF})
        if f.kind == "cpus":
            out.append({f.core_name: [f.max + 1]})
        for other, values in f.applies:
            o = schema.BY_NAME[other]
            wrong = next(i for i, c in enumerate(o.choices) if c not in values)
            value = {"u32": 3, "u64": 3, "bool": True, "double": 0.5, "string": "x",
                     "cpus": [0], "pages": [0]}.get(f.kind)
            if f.kind == "enum":
                value = (f.core_default + 1) % len(f.choices)
            out.append({f.core_name: value, o.core_name: wrong})
    out += [
        {"guest_page_size": 8192},
        {"mem_per_vcpu": 4096 * 3, "guest_page_size": 2 << 20},
        {"vcpus": 4096, "mem_per_vcpu": 1 << 40},
        {"uffd_mode": _core.UFFD_MINOR},
        {"uffd_mode": _core.UFFD_WP, "backing": _core.BACKING_ANONYMOUS_THP},
        {"uffd_mode": _core.UFFD_WP, "wp_async": True, "resolver": _core.RESOLVER_VCPU},
        {"access": _core.ACCESS_ZIPF},
        {"access": _core.ACCESS_ZIPF, "zipf_theta": 1.0, "pattern": _core.PATTERN_RANDOM},
        {"access": _core.ACCESS_ZIPF, "zipf_theta": 1.0, "overlap": True, "vcpus": 4096,
         "accesses": 1 << 24},
        {"touch_percent": 50, "mem_per_vcpu": 128 << 30},
        {"resolve": _core.RESOLVE_ZEROPAGE, "uffd_mode": _core.UFFD_MINOR,
         "backing": _core.BACKING_SHMEM},
        {"resolve": _core.RESOLVE_ZEROPAGE, "backing": _core.BACKING_ANONYMOUS_HUGETLB,
         "mem_per_vcpu": 2 << 20},
        {"resolve": _core.RESOLVE_MOVE, "uffd_mode": _core.UFFD_NONE},
        {"resolve": _core.RESOLVE_MOVE, "backing": _core.BACKING_SHMEM},
        {"source": _core.SOURCE_FILE, "source_path": "/x", "prefault": True},
        {"source": _core.SOURCE_FILE},
        {"source": _core.SOURCE_REMOTE, "source_path": "/x"},
        {"prefetch": _core.PREFETCH_READAHEAD, "resolve": _core.RESOLVE_ZEROPAGE},
        {"prefetch": _core.PREFETCH_BACKGROUND, "prefault": True},
        {"prefetch": _core.PREFETCH_REPLAY},
        {"prefetch": _core.PREFETCH_REPLAY, "replay": list(range(17))},
        {"prefetch": _core.PREFETCH_REPLAY, "replay": [99]},
        {"prefetch": _core.PREFETCH_REPLAY, "replay": [1, 1]},
        {"preinstall": [1], "source": _core.SOURCE_FILE, "source_path": "/x", "prefault": True},
        {"preinstall": [1], "source": _core.SOURCE_FILE, "source_path": "/x",
         "resolve": _core.RESOLVE_MOVE},
        {"preinstall": [1]},
        {"preinstall": [1], "source": _core.SOURCE_REMOTE, "source_address": "unix:/x"},
        {"preinstall": [16], "source": _core.SOURCE_FILE, "source_path": "/x"},
        {"preinstall": [2, 2], "source": _core.SOURCE_FILE, "source_path": "/x"},
        # The throttle's percentages are auto_converge's, and start at or below its most.
        *({**migrating, name: 50} for name in ("throttle_initial_percent",
                                               "throttle_increment_percent",
                                               "throttle_max_percent")),
        {**migrating, "auto_converge": True, "throttle_initial_percent": 60,
         "throttle_max_percent": 50},
        {**migrating, "auto_converge": True, "max_rounds": 1},
        {**migrating, "auto_converge": True, "migration": _core.MIGRATION_HYBRID},
    ]
    return out


def bad_core_configs():
    base = core_config(Config(mem_per_vcpu="64K"))
    return [{**base, **change} for change in bad_changes()]


def test_every_refusal_sets_configerror_field():
    """Each sample config is refused, and the message's first word is a
    field: the one run()'s and Config's ConfigError.field is set from."""
    seen = set()
    for d in bad_core_configs():
        with pytest.raises(_core.CoreError) as info:
            _core.validate(d)
        kind, _, message = info.value.args
        assert kind == _core.ERR_CONFIG, message
        field = message.partition(":")[0]
        assert field in schema.BY_NAME, message
        error = ConfigError(message, field=uffdkvm.config._field_of(message))
        assert error.field == field
        seen.add(message)
    assert len(seen) > 60, len(seen)


def test_a_config_error_from_config_always_has_its_field():
    """Through Config: the refusals of the core's rules (a sample of each
    kind) come back as ConfigError with .field set."""
    for fields in ({"resolver": "vcpu", "wait": "poll"}, {"prefetch_pages": 2},
                   {"trace_faults": True, "stats": "basic"}, {"uffd_mode": "minor"},
                   {"access": "zipf"}, {"resolve": "move", "backing": "shmem"},
                   {"remote_transport": "tcp"}, {"vcpus": 5000}):
        with pytest.raises(ConfigError) as info:
            Config(**fields)
        assert info.value.field in schema.BY_NAME, (fields, str(info.value))
        assert str(info.value).startswith(info.value.field + ": ")
