"""Result.to_json() and Result.from_json(): a lossless round trip, generic over
the dataclass fields, with the host that ran the experiment recorded."""
from __future__ import annotations

import dataclasses
import enum
import json
import os
import platform
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Tuple, Union

import pytest

import uffdkvm
from conftest import skip_without_kvm
from uffdkvm import HostInfo, Result, serial


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
    assert text.startswith('{"schema": 2, "config": {')
    d = json.loads(text)
    assert d["config"]["timeout_s"] == 60.0 and d["faults"] == 512
    assert Result.from_json(result.to_json(indent=2)) == result


def test_every_result_records_its_host(result):
    h = result.host
    assert h == HostInfo.current()
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
    assert back == r and back.readers == [] and back.config.uffd_mode is None


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
    d["config"]["vcpus"] = 0
    with pytest.raises(uffdkvm.ConfigError, match="vcpus"):
        Result.from_json(json.dumps(d))
    d["schema"] = 99
    with pytest.raises(ValueError, match="upgrade uffdkvm"):
        Result.from_json(json.dumps(d))
    with pytest.raises(ValueError, match="JSON object"):
        Result.from_json("[]")


# ---- generic: types a future field may have --------------------------------

class Unit(enum.Enum):
    NS = "ns"
    US = "us"


class Bucket(NamedTuple):
    low_ns: int
    count: int


@dataclass(frozen=True)
class Histogram:
    unit: Unit
    buckets: Tuple[Bucket, ...]
    by_cpu: Dict[int, float]


@dataclass(frozen=True)
class Future:
    config: uffdkvm.Config
    latency: Histogram
    maybe: Optional[Histogram]
    passes: List[Histogram]
    size: Union[int, str]
    pair: Tuple[int, str]
    blocktime_seconds: float = 0.0
    notes: List[str] = field(default_factory=list)


def test_nested_types_of_new_fields_round_trip():
    h = Histogram(Unit.US, (Bucket(0, 3), Bucket(1024, 5)), {0: 1.5, 3: 2.0})
    x = Future(uffdkvm.Config(mem_per_vcpu="64M", uffd_mode=None), h, None, [h, h], "64M",
               (1, "a"), 2.5, ["x"])
    text = serial.to_json(x)
    back = serial.from_json(Future, text)
    assert back == x
    assert isinstance(back.latency.buckets[1], Bucket) and back.latency.unit is Unit.US
    assert back.latency.by_cpu == {0: 1.5, 3: 2.0}
    assert serial.from_json(Future, text.replace('"size": "64M"', '"size": 7')).size == 7
    # Fields with defaults may be missing (JSON from before they existed).
    d = json.loads(text)
    del d["blocktime_seconds"], d["notes"]
    assert serial.from_json(Future, json.dumps(d)) == dataclasses.replace(
        x, blocktime_seconds=0.0, notes=[])


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
    assert back.fault_trace.raised_ns == [None] * 64
    assert back.kvm_run_seconds == back.seconds == r.kvm_run_seconds
    f = back.faults_frame()  # the columns 0.1 did not record are unknown, not missing
    assert len(f) == 64 and f["write"].isna().all() and f["queue_ns"].isna().all()
    assert (f["service_ns"] == f["resolved_ns"] - f["read_ns"]).all()
    with pytest.raises(ValueError, match="schema"):
        Result.from_json(json.dumps({**old, "schema": 0}))
