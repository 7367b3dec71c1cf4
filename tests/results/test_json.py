"""Result.to_json() and Result.from_json(): a lossless round trip of strict
JSON over the dataclass fields, with the host that ran the experiment
recorded, and files of older schemas read under today's names."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import platform

import pytest

import uffdkvm
from helpers.skips import skip_without_kvm
from uffdkvm import HostInfo, Result, ResultError


@pytest.fixture(scope="module")
def result(kvm_reason):
    skip_without_kvm(kvm_reason)
    r = uffdkvm.run(vcpus=2, mem_per_vcpu="1M", readers=2, timeout_s=60)
    assert r.verified, r.verify_message
    return r


def test_round_trip_is_equal_config_and_host_included(result):
    back = Result.from_json(result.to_json())
    assert back == result
    assert back.config == result.config and back.host == result.host
    assert back.vcpus[1].kvm_stats == result.vcpus[1].kvm_stats
    assert isinstance(back.vcpus[0], uffdkvm.VcpuStats)
    assert isinstance(back.host, HostInfo)


def test_json_is_one_line_with_the_schema_first(result):
    text = result.to_json()
    assert "\n" not in text
    assert text.startswith('{"schema": 4, "config": {')
    d = json.loads(text)
    assert d["config"]["timeout_s"] == 60.0 and d["faults"] == 512
    assert Result.from_json(result.to_json(indent=2)) == result


# What other processes change while a session runs: huge page pools (another
# session's hugepages fixture adds to them and takes back, on a shared host).
VOLATILE = ("hugepages_2m", "hugepages_2m_free", "hugepages_1g", "hugepages_1g_free")


def test_every_result_records_its_host(result):
    h = result.host
    now = HostInfo.current()
    assert dataclasses.replace(h, **{k: 0 for k in VOLATILE}) == \
        dataclasses.replace(now, **{k: 0 for k in VOLATILE})
    assert all(isinstance(getattr(h, k), int) and getattr(h, k) >= 0 for k in VOLATILE)
    assert h.kernel_release == os.uname().release
    assert h.name == os.uname().nodename
    assert h.cpus == os.cpu_count() and 1 <= h.usable_cpus <= h.cpus
    assert h.cpu_model
    assert h.memory_bytes > 0
    assert h.python_version == platform.python_version()
    assert h.uffdkvm_version == uffdkvm.__version__


def test_without_userfaultfd_round_trips(kvm):
    r = uffdkvm.run(mem_per_vcpu="1M", uffd_mode=None)
    back = Result.from_json(r.to_json())
    assert back == r and back.readers == () and back.config.uffd_mode is None


def test_a_result_made_without_host_still_works(result):
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(Result)
              if f.name != "host"}
    old = Result(**fields)
    assert old.host is None
    assert Result.from_json(old.to_json()) == old


def test_reads_to_dict_output_and_json_from_before_hosts(result):
    # The CLI's --json prints to_dict(), which adds derived values: ignored.
    assert Result.from_json(json.dumps(result.to_dict())) == result
    d = json.loads(result.to_json())
    del d["host"], d["schema"]
    assert Result.from_json(json.dumps(d)) == dataclasses.replace(result, host=None)


def test_bad_json_names_what_is_wrong(result):
    d = json.loads(result.to_json())
    del d["seconds"]
    with pytest.raises(ValueError, match="no 'seconds'"):
        Result.from_json(json.dumps(d))
    d = json.loads(result.to_json())
    d["vcpus"][1]["seconds"] = "fast"
    with pytest.raises(ValueError, match=r"\$\.vcpus\[1\]\.seconds: expected float"):
        Result.from_json(json.dumps(d))
    d = json.loads(result.to_json())
    d["config"]["vcpus"] = 0  # a Config's own check, as a ResultError that says where
    with pytest.raises(ResultError, match=r"\$\.config: .*vcpus: must be between 1"):
        Result.from_json(json.dumps(d))
    d["schema"] = 99
    with pytest.raises(ValueError, match="upgrade uffdkvm"):
        Result.from_json(json.dumps(d))
    with pytest.raises(ValueError, match="JSON object"):
        Result.from_json("[]")


def refuse_constant(name):
    raise AssertionError(f"not strict JSON: {name}")


def strict(text):
    """json.loads that refuses NaN, Infinity and -Infinity (as jq does)."""
    return json.loads(text, parse_constant=refuse_constant)


def test_json_is_strict_and_non_finite_floats_come_back(kvm, tmp_path):
    r = uffdkvm.run(vcpus=1, mem_per_vcpu="64K", timeout_s=math.inf)
    d = strict(r.to_json())
    assert d["config"]["timeout_s"] == "inf"
    assert Result.from_json(r.to_json()).config.timeout_s == math.inf
    assert strict(json.dumps(r.to_dict()))["config"]["timeout_s"] == "inf"
    # What sweep(out=) appends, line by line, is strict too.
    out = tmp_path / "runs.jsonl"
    uffdkvm.sweep(uffdkvm.Config(mem_per_vcpu="64K", timeout_s=math.inf),
                  readers=[1, 2], progress=False, out=out)
    lines = out.read_text().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert strict(line)["config"]["timeout_s"] == "inf"
    assert [x.config.timeout_s for x in uffdkvm.read_results(out)] == [math.inf] * 2


@dataclasses.dataclass(frozen=True)
class Odd:
    low: float
    undefined: float


def test_nan_and_negative_infinity_round_trip_too():
    """serial writes every non-finite float as a string and reads it back;
    a Result holds none outside its config (see test_result_invariants)."""
    text = uffdkvm.io.serial.to_json(Odd(-math.inf, math.nan))
    assert strict(text) == {"schema": uffdkvm.io.serial.SCHEMA, "low": "-inf", "undefined": "nan"}
    back = uffdkvm.io.serial.from_json(Odd, text)
    assert back.low == -math.inf and math.isnan(back.undefined)


def test_text_that_is_not_json_is_a_result_error(result):
    with pytest.raises(ResultError, match="not JSON"):
        Result.from_json("{nope")
    d = json.loads(result.to_json())
    d["seconds"] = "infinite"  # only "inf", "-inf" and "nan" stand for floats
    with pytest.raises(ResultError, match=r"\$\.seconds: expected float"):
        Result.from_json(json.dumps(d))


def schema_2(r, marked=True):
    """A fresh Result rewritten as uffdkvm wrote schema 2: VcpuStats.faults
    counted EEXIST messages and there was no eexist beside it, the trace had
    no start, and timeout_s=inf was the bare literal Infinity. Unmarked: as
    its to_dict() and `uffdkvm --json` wrote it, with no "schema" key."""
    old = json.loads(r.to_json())
    if marked:
        old["schema"] = 2
    else:
        del old["schema"]
    for v in old["vcpus"]:
        v["faults"] += v.pop("eexist")
    if old["fault_trace"] is not None:
        del old["fault_trace"]["start_ns"]
    text = json.dumps(old)
    return text.replace('"timeout_s": "inf"', '"timeout_s": Infinity')


def test_schema_2_files_load_with_vcpu_faults_without_eexist(kvm):
    r = uffdkvm.run(vcpus=2, mem_per_vcpu="256K", trace_faults=True, timeout_s=math.inf)
    assert r.eexist == 0
    back = Result.from_json(schema_2(r))
    assert back.config.timeout_s == math.inf
    assert [v.faults for v in back.vcpus] == [v.faults for v in r.vcpus] == [64, 64]
    assert [v.eexist for v in back.vcpus] == [0, 0]
    assert back.fault_trace.start_ns is None and back.fault_trace.read_ns == r.fault_trace.read_ns
    assert back.faults_frame()["t_s"].isna().all()  # the start was not recorded


@pytest.mark.parametrize("marked", [True, False], ids=["schema-2", "unmarked"])
def test_schema_2_files_with_eexist_leave_the_vcpu_split_unknown(kvm, marked):
    r = uffdkvm.run(OVERLAP_RACE)
    assert r.eexist > 0 and sum(v.eexist for v in r.vcpus) == r.eexist
    back = Result.from_json(schema_2(r, marked))
    assert [v.faults for v in back.vcpus] == [None] * len(r.vcpus)
    assert back.faults == r.faults and back.eexist == r.eexist  # the readers' counts hold
    # read as schema 2, not 1: no stage renamed onto another
    assert [v.service_latency for v in back.vcpus] == [v.service_latency for v in r.vcpus]


@pytest.mark.parametrize("marked", [True, False], ids=["schema-3", "unmarked"])
@pytest.mark.parametrize("source", ["synthetic", "file"])
def test_schema_3_files_load_with_the_readers_sums(kvm, marked, source, tmp_path):
    """Schema 3 named every reader's wakes after EEXIST prefetch_wakes at the
    Result's level (ReaderStats' wakes), and had no eexist, spurious_wakeups,
    source_bytes or source_seconds of the run's own (Python summed them):
    they load under the one name, summed from the readers."""
    if source == "file":
        uffdkvm.make_snapshot(tmp_path / "snap", 2 << 20)
        r = uffdkvm.run(OVERLAP_RACE, source="file", source_path=str(tmp_path / "snap"))
        assert r.source_bytes > 0 and r.source_seconds > 0
    else:
        r = uffdkvm.run(OVERLAP_RACE)
    assert r.wakes == sum(x.wakes for x in r.readers) == r.eexist > 0
    assert r.spurious_wakeups == sum(x.spurious_wakeups for x in r.readers)
    old = json.loads(r.to_json())
    old["prefetch_wakes"] = old.pop("wakes")
    for name in ("eexist", "spurious_wakeups", "source_bytes", "source_seconds"):
        del old[name]
    if marked:
        old["schema"] = 3
    else:
        del old["schema"]
    back = Result.from_json(json.dumps(old))
    # The readers' seconds summed, as the core's nanoseconds summed then
    # converted: equal but for rounding.
    if r.source_seconds is None:
        assert back.source_seconds is None
    else:
        assert back.source_seconds == pytest.approx(r.source_seconds, rel=1e-12)
    assert dataclasses.replace(back, source_seconds=r.source_seconds) == r


def test_to_dict_says_its_schema(kvm):
    d = uffdkvm.run(vcpus=1, mem_per_vcpu="64K").to_dict()
    assert d["schema"] == uffdkvm.io.serial.SCHEMA
    assert Result.from_json(json.dumps(d)).faults == 16


# Several vCPUs over the same pages, in the same order: their faults on a page
# race, and the readers find some already resolved (EEXIST).
OVERLAP_RACE = uffdkvm.Config(vcpus=4, mem_per_vcpu="2M", overlap=True, readers=32,
                              wait="epoll", delay_us=20)


def test_schema_1_files_load_under_the_stage_names(kvm):
    """JSON written by uffdkvm 0.1 (schema 1) named the service stage
    fault_latency / latency and the trace's times start_ns / end_ns, and its
    seconds was the first-KVM_RUN-to-done window. Rewrite a fresh Result in
    that old shape and read it back: every value lands under its new name."""
    r = uffdkvm.run(vcpus=1, mem_per_vcpu="256K", trace_faults=True)
    old = json.loads(r.to_json())
    old["schema"] = 1
    old["seconds"] = old.pop("kvm_run_seconds")
    for v in old["vcpus"]:
        for stage in ("queue_latency", "resume_latency", "fault_latency"):
            v.pop(stage)
        v["fault_latency"] = v.pop("service_latency")
    for x in old["readers"]:
        x.pop("queue_latency")
        x["latency"] = x.pop("service_latency")
    t = old["fault_trace"]
    t.pop("raised_ns"), t.pop("resumed_ns"), t.pop("write")
    t["start_ns"], t["end_ns"] = t.pop("read_ns"), t.pop("resolved_ns")

    back = Result.from_json(json.dumps(old))
    assert back.vcpus[0].service_latency == r.vcpus[0].service_latency
    assert back.vcpus[0].service_latency.count == 64
    assert back.vcpus[0].fault_latency is None  # the whole fault was never measured
    assert back.readers[0].service_latency == r.readers[0].service_latency
    assert back.fault_trace.read_ns == r.fault_trace.read_ns
    assert back.fault_trace.resolved_ns == r.fault_trace.resolved_ns
    assert back.fault_trace.raised_ns == (None,) * 64
    assert back.kvm_run_seconds == back.seconds == r.kvm_run_seconds
    f = back.faults_frame()  # the columns 0.1 did not record are unknown, not missing
    assert len(f) == 64 and f["write"].isna().all() and f["queue_ns"].isna().all()
    assert (f["service_ns"] == f["resolved_ns"] - f["read_ns"]).all()
    with pytest.raises(ValueError, match="schema"):
        Result.from_json(json.dumps({**old, "schema": 0}))
