"""Every member of ukvm.h's result structs reaches Python under its own name.

The counters are declared in ukvm.h's structs and handed over by the
hand-written tables of csrc/python/result.c (result_fields, vcpu_fields,
reader_fields, trace_fields). A member left out of a table would be dropped
without a word; this test parses the structs and finds it missing from the
core's raw dict.
"""
import re
from pathlib import Path

import pytest

from uffdkvm import Config, _core
from uffdkvm.config import core_config

pytestmark = pytest.mark.kvm

UKVM_H = Path(__file__).resolve().parent.parent / "csrc" / "ukvm.h"

#: Members the tables do not hand over under their own name, each with why.
NOT_HANDED_OVER = {
    "ukvm_result": {
        # Counts of the arrays next to them: the lists have their length.
        "nr_fault_trace", "nr_vcpus", "nr_readers", "nr_kvm_stats", "nr_vcpu_stats",
        "nr_page_visits", "nr_touch_order", "nr_dirty_passes", "nr_migration_rounds",
        "nr_migrated_pages",
        # The stats' names: the keys of the kvm_stats dicts (the run's and each vCPU's).
        "kvm_stat_names", "vcpu_stat_names",
    },
    "ukvm_vcpu_result": set(),
    "ukvm_reader_result": set(),
    "ukvm_fault_record": set(),
    "ukvm_dirty_pass": set(),
    "ukvm_migration_round": set(),
}


def struct_members(name):
    """The member names of struct name in ukvm.h, comments dropped."""
    text = re.sub(r"/\*.*?\*/", "", UKVM_H.read_text(), flags=re.S)
    body = re.search(rf"^struct {name} \{{(.*?)^\}};", text, flags=re.S | re.M)
    assert body, f"struct {name} not found in {UKVM_H}"
    members = []
    for decl in body.group(1).split(";"):
        decl = decl.strip()
        if not decl:
            continue
        m = re.search(r"(\w+)\s*(\[[^\]]*\])?$", decl)
        assert m, decl
        members.append(m.group(1))
    return members


def test_the_parser_reads_the_structs():
    """A guard on the parser itself: known members at both ends of each struct."""
    assert struct_members("ukvm_result")[:2] == ["threads_start_ns", "threads_joined_ns"]
    assert struct_members("ukvm_result")[-1] == "verify_message"
    assert "read_sizes" in struct_members("ukvm_reader_result")
    assert "access_hist" in struct_members("ukvm_vcpu_result")
    assert struct_members("ukvm_fault_record")[-1] == "write"


def migration_round(tmp_path):
    """A pre-copy round of a migration's source, as the core hands it over."""
    raw = _core.run(core_config(Config(mem_per_vcpu="64K", uffd_mode=None, passes=100,
                                       dirty_tracking="bitmap", migration="precopy",
                                       migration_dump_path=str(tmp_path / "dump"))))
    return raw["migration_rounds"][0]


def test_every_member_is_in_the_raw_dict(tmp_path):
    """One run with the fault trace on: each struct's members, less the few
    above, are keys of its dict (the run's, a vCPU's, a reader's, the
    trace's columns). The core is called directly, not through the kvm
    fixture's uffdkvm.run, whose Result may itself trip over a missing key."""
    try:
        raw = _core.run(core_config(Config(mem_per_vcpu="64K", trace_faults=True, passes=2,
                                           dirty_tracking="bitmap")))
    except _core.CoreError as e:
        if e.args[0] == _core.ERR_HOST:
            pytest.skip(f"this host cannot run experiments: {e.args[2]}")
        raise
    keys = {
        "ukvm_result": set(raw),
        "ukvm_vcpu_result": set(raw["vcpus"][0]),
        "ukvm_reader_result": set(raw["readers"][0]),
        "ukvm_dirty_pass": set(raw["dirty_passes"][0]),
        "ukvm_fault_record": set(raw["fault_trace"]),
        "ukvm_migration_round": set(migration_round(tmp_path)),
    }
    dropped = {}
    for struct, skipped in NOT_HANDED_OVER.items():
        members = struct_members(struct)
        assert skipped <= set(members), f"{struct}: no such member {skipped - set(members)}"
        missing = [m for m in members if m not in skipped and m not in keys[struct]]
        if missing:
            dropped[struct] = missing
    assert not dropped, f"members the tables of csrc/python/result.c drop: {dropped}"
