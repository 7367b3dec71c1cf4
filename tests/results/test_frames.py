"""DataFrames: one row per vCPU, per reader and per run, units in the names,
built from the dataclass fields so that new fields become columns."""
from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
from dataclasses import dataclass
from typing import Dict, List

import pytest

import uffdkvm
from helpers.children import ENV as CHILD_ENV
from helpers.children import python
from helpers.skips import skip_without_kvm
from uffdkvm.io import frames

pd = pytest.importorskip("pandas")

# A float column names its unit: seconds, _s, _ns, _us, _bytes, a rate, a ratio.
UNIT = re.compile(r"(seconds|_s|_ns|_us|_bytes|_per_fault)(_min|_max|_per_vcpu)?$")


@pytest.fixture(scope="module")
def result(kvm_reason):
    skip_without_kvm(kvm_reason)
    r = uffdkvm.run(vcpus=2, mem_per_vcpu="2M", readers=2, wait="poll")
    assert r.verified, r.verify_message
    return r


def test_import_uffdkvm_loads_no_analysis_package():
    code = ("import sys, uffdkvm; "
            "print(sorted(m for m in ('pandas', 'numpy', 'tqdm', 'dask', 'distributed') "
            "if m in sys.modules))")
    p = subprocess.run(python(code=code), capture_output=True, text=True,
                       env=CHILD_ENV, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_vcpus_frame_has_one_row_per_vcpu_and_every_field(result):
    df = result.vcpus_frame()
    assert len(df) == 2
    assert list(df["vcpu"]) == [0, 1]
    for f in dataclasses.fields(uffdkvm.VcpuStats):
        values = [getattr(v, f.name) for v in result.vcpus]
        if f.name == "index":
            continue
        if isinstance(values[0], dict):  # kvm_stats: one kvm_<name> column per statistic
            for name in values[0]:
                assert list(df[f"kvm_{name}"]) == [v[name] for v in values]
        elif "Histogram" in str(f.type):  # summarised: count, mean, percentiles, max
            assert list(df[f"{f.name}_count"]) == [h.count if h else None for h in values]
            if values[0] is not None:
                assert list(df[f"{f.name}_p99_ns"]) == [h.percentile(99) for h in values]
        else:
            assert list(df[f.name]) == values, f.name
    assert list(df["first_pass_pages_per_s"]) == [v.first_pass_pages_per_s
                                                  for v in result.vcpus]
    assert "pages_per_s" not in df  # the run's rate alone bears that name
    if result.vcpus[0].kvm_stats:
        assert list(df["kvm_exits"]) == [v.kvm_stats["exits"] for v in result.vcpus]


def test_readers_frame_has_one_row_per_reader(result):
    df = result.readers_frame()
    assert len(df) == result.uffds * 2 == 4
    assert list(df[["uffd", "reader"]].itertuples(index=False, name=None)) == \
        [(0, 0), (0, 1), (1, 0), (1, 1)]
    for f in dataclasses.fields(uffdkvm.ReaderStats):
        values = [getattr(x, f.name) for x in result.readers]
        if f.name == "index":
            continue
        if "Histogram" in str(f.type):
            assert list(df[f"{f.name}_count"]) == [h.count if h else None for h in values]
        else:
            assert list(df[f.name]) == values, f.name
    assert df["faults"].sum() == result.faults == 1024


def test_to_frame_is_one_row_of_config_results_and_aggregates(result):
    df = result.to_frame()
    assert len(df) == 1
    row = df.iloc[0]
    for name, value in result.config.to_dict().items():
        assert row[name] == value or (value is None and pd.isna(row[name])), name
    assert row["region_bytes"] == result.config.region_bytes
    # The Result's scalars, with a unit where the name had none.
    assert row["seconds"] == result.seconds
    assert row["faults"] == 1024
    assert row["pages_per_s"] == result.paging_rate
    assert row["pages_per_s_per_vcpu"] == result.per_vcpu_rate
    assert row["page_size_bytes"] == 4096
    assert row["verified"] == True  # noqa: E712 (a numpy bool)
    assert not {"paging_rate", "per_vcpu_rate", "page_size"} & set(df.columns)
    # Aggregates over threads.
    readers = result.readers
    assert row["spurious_wakeups_per_fault"] == \
        sum(x.spurious_wakeups for x in readers) / result.faults
    assert row["context_switches_per_fault"] == \
        sum(x.context_switches for x in readers) / result.faults
    assert row["readers_wakeups"] == sum(x.wakeups for x in readers)
    assert row["readers_faults_max"] == max(x.faults for x in readers)
    assert row["readers_busy_seconds"] == pytest.approx(sum(x.busy_seconds for x in readers))
    assert row["vcpus_seconds_max"] == max(v.seconds for v in result.vcpus)
    assert row["vcpus_seconds_min"] == min(v.seconds for v in result.vcpus)
    assert row["vcpus_pages"] == 1024
    if result.vcpus[0].kvm_stats:
        # Per-vCPU KVM counters summed; VM-wide ones as they are.
        assert row["vcpus_kvm_exits"] == sum(v.kvm_stats["exits"] for v in result.vcpus)
        for name, value in result.kvm_stats.items():
            assert row[f"kvm_{name}"] == value
    # Where it ran.
    assert row["host_kernel_release"] == os.uname().release
    assert row["host_cpus"] == os.cpu_count()
    # Identifiers are not summed.
    assert not {"vcpus_tid", "vcpus_vcpu", "readers_uffd", "readers_reader"} & set(df.columns)


def test_every_float_column_names_its_unit(result):
    for df in (result.to_frame(), result.vcpus_frame(), result.readers_frame()):
        floats = [c for c in df.columns if pd.api.types.is_float_dtype(df[c])]
        assert floats
        assert [c for c in floats if not UNIT.search(c)] == []


def test_without_userfaultfd_readers_are_empty_and_ratios_nan(kvm):
    r = uffdkvm.run(vcpus=1, mem_per_vcpu="1M", uffd_mode=None)
    readers = r.readers_frame()
    assert len(readers) == 0
    assert list(readers.columns) == [
        "reader" if f.name == "index" else f.name for f in dataclasses.fields(uffdkvm.ReaderStats)]
    row = r.to_frame().iloc[0]
    assert row["faults"] == 0 and row["readers_faults"] == 0
    assert math.isnan(row["spurious_wakeups_per_fault"])
    assert row["uffd_mode"] is None
    assert r.vcpus_frame()["pages"].tolist() == [256]


# ---- new fields become columns without touching frames.py -----------------

@dataclass(frozen=True)
class Hist:
    buckets: List[int]
    count: int

    @property
    def mean_ns(self) -> float:
        return sum(self.buckets) / self.count


@dataclass(frozen=True)
class Thread:
    index: int
    seconds: float
    faults: int
    latency: Hist
    backing_stats: Dict[str, int]
    pass_seconds: List[float]


@dataclass(frozen=True)
class Run:
    config: uffdkvm.Config
    seconds: float
    blocktime_seconds: float
    threads: List[Thread]


def test_new_fields_become_columns():
    threads = [Thread(i, 0.5 + i, 10 * (i + 1), Hist([1, 2, 3], 3), {"max_depth": i, "hits": 2},
                      [0.25, 0.25 + i]) for i in range(2)]
    run = Run(uffdkvm.Config(), 2.0, 0.1, threads)
    rows = frames.table_rows(run, "threads")
    assert rows[1] == {"thread": 1, "seconds": 1.5, "faults": 20, "pass_seconds": [0.25, 1.25],
                       "latency_buckets": [1, 2, 3], "latency_count": 3, "latency_mean_ns": 2.0,
                       "backing_max_depth": 1, "backing_hits": 2}
    row = frames.run_row(run)
    assert row["readers"] == 1 and row["blocktime_seconds"] == 0.1
    assert row["threads_seconds"] == 2.0 and row["threads_seconds_max"] == 1.5
    assert row["threads_backing_hits"] == 4          # dict-born counters are summed
    assert row["threads_backing_max_depth"] == 1     # peaks (max_*) take the max
    assert row["seconds_per_fault"] == 2.0 / 30      # a table that counts faults
    config_fields = {f.name for f in dataclasses.fields(uffdkvm.Config)}  # remote_latency_us
    # nested values are not summed
    assert not [c for c in row if "latency" in c and c not in config_fields]
