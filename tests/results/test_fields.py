"""Every result value reaches Python under its own name, as the result
schema (uffdkvm/schema/results.py) declares it.

The structs' members, the binding's tables and the dataclasses' fields are
all generated from the schema (tests/project/test_schema.py fails while any is
stale), so they cannot disagree on paper. What is left to check is what the
built extension does: that the dicts a real run hands over hold exactly the
members the schema says the binding hands over, and that each becomes its
field.
"""
import dataclasses

import pytest

import uffdkvm
from uffdkvm import Config, _core
from uffdkvm.schema import results as schema_results
from uffdkvm.config import core_config

pytestmark = pytest.mark.kvm


def handed_over(struct):
    """The members of a struct the schema says the binding hands over."""
    return {v.name for v in struct.values if v.conversion}


def test_the_dataclasses_are_the_schemas():
    """Each dataclass's fields, in order, are its struct's Python values (the
    generated section of uffdkvm/result.py, imported)."""
    for struct in schema_results.STRUCTS:
        cls = getattr(uffdkvm, struct.py, None) or getattr(uffdkvm.result, struct.py)
        assert [f.name for f in dataclasses.fields(cls)] == \
            [v.py_name for v in struct.fields], struct.py
        for v in struct.fields:
            assert f"\n    {v.py_name} " in cls.__doc__, f"{struct.py}.{v.py_name}: no doc"


def test_a_duration_is_seconds_in_python():
    """The one conversion: the core's X_ns (a duration) is Python's X_seconds."""
    busy = next(v for v in schema_results.READER_RESULT.values if v.name == "busy_ns")
    assert busy.py_name == "busy_seconds"
    stamp = next(v for v in schema_results.FAULT_RECORD.values if v.name == "read_ns")
    assert stamp.py_name == "read_ns"


def migration_round(tmp_path):
    """A pre-copy round of a migration's source, as the core hands it over."""
    raw = _core.run(core_config(Config(mem_per_vcpu="64K", uffd_mode=None, passes=100,
                                       dirty_tracking="bitmap", migration="precopy",
                                       migration_dump_path=str(tmp_path / "dump"))))
    return raw["migration_rounds"][0]


def test_every_member_is_in_the_raw_dict(tmp_path):
    """One run with the fault trace on: each struct's dict (the run's, a
    vCPU's, a reader's, a dirty pass's, a migration round's, the trace's
    columns) has exactly the members the schema hands over, no fewer and no
    more. The core is called directly, not through the kvm fixture's
    uffdkvm.run, whose Result may itself trip over a missing key."""
    try:
        raw = _core.run(core_config(Config(mem_per_vcpu="64K", trace_faults=True, passes=2,
                                           dirty_tracking="bitmap")))
    except _core.CoreError as e:
        if e.args[0] == _core.ERR_HOST:
            pytest.skip(f"this host cannot run experiments: {e.args[2]}")
        raise
    keys = {
        "result": set(raw) - {"config"},  # beside them: the core's own copy of its config
        "vcpu_result": set(raw["vcpus"][0]),
        "reader_result": set(raw["readers"][0]),
        "dirty_pass": set(raw["dirty_passes"][0]),
        "fault_record": set(raw["fault_trace"]),
        "migration_round": set(migration_round(tmp_path)),
    }
    for struct in schema_results.STRUCTS:
        assert keys[struct.c] == handed_over(struct), struct.c


def test_every_field_comes_from_its_member(kvm):
    """The one conversion goes the right way: every duration the core counts
    in ns is, in a run's Result, a float of seconds (left in ns, a run of
    this size would read as hours)."""
    r = uffdkvm.run(vcpus=1, mem_per_vcpu="64K")
    for struct, obj in ((schema_results.RESULT, r), (schema_results.VCPU_RESULT, r.vcpus[0]),
                        (schema_results.READER_RESULT, r.readers[0])):
        for v in struct.fields:
            value = getattr(obj, v.py_name)
            if v.conversion and v.unit == "s" and value is not None:
                assert isinstance(value, float) and value < 3600, (struct.py, v.py_name)
