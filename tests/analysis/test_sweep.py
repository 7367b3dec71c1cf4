"""sweep(): the grid, trials, the out file and resuming, failures that do not
stop it, executors (a local dask cluster included)."""
import concurrent.futures
import importlib
import itertools
import json
import logging

import pytest

import uffdkvm
from uffdkvm import Config, ConfigError, SweepWarning

pd = pytest.importorskip("pandas")
sweep_module = importlib.import_module("uffdkvm.analysis.sweep")

BASE = Config(vcpus=1, mem_per_vcpu="1M")  # 256 faults: a few ms a run
PAGES = 256


@pytest.fixture
def counted(monkeypatch):
    """The Configs the sweep actually runs (in this process)."""
    ran = []
    real = sweep_module._run_point

    def run_point(config, token=""):
        ran.append(config)
        return real(config, token)

    monkeypatch.setattr(sweep_module, "_run_point", run_point)
    return ran


def lines(path):
    return path.read_text().splitlines()


def test_every_combination_runs_trials_times(kvm):
    df = uffdkvm.sweep(BASE, readers=[1, 2], wait=["poll", "epoll_exclusive"], trials=2,
                       progress=False)
    assert len(df) == 8
    assert df.columns[0] == "trial" and df.columns[-1] == "error"
    # Ordered by point (the last field varies fastest), then trial.
    assert list(df[["readers", "wait", "trial"]].itertuples(index=False, name=None)) == \
        list(itertools.product([1, 2], ["poll", "epoll_exclusive"], [0, 1]))
    assert df["error"].isna().all()
    assert df["verified"].all()
    assert (df["faults"] == PAGES).all()
    assert (df["vcpus"] == 1).all() and (df["mem_per_vcpu"] == 1 << 20).all()
    assert (df["pages_per_s"] > 0).all()
    assert df.pivot_table(index="readers", columns="wait", values="pages_per_s",
                          aggfunc="median").shape == (2, 2)


def test_scalars_are_held_fixed_and_base_defaults_to_config(kvm):
    df = uffdkvm.sweep(readers=[1, 2], vcpus=2, mem_per_vcpu="1M", progress=False)
    assert list(df["readers"]) == [1, 2]
    assert (df["vcpus"] == 2).all() and (df["faults"] == 2 * PAGES).all()


def test_points_are_distinct_configs_in_grid_order():
    points = sweep_module.points(BASE, mem_per_vcpu=["1M", 1 << 20, "2M"], readers=range(1, 3))
    assert [(c.mem_per_vcpu, c.readers) for c in points] == \
        [(1 << 20, 1), (1 << 20, 2), (2 << 20, 1), (2 << 20, 2)]


def test_bad_points_fail_before_anything_runs(tmp_path, counted):
    out = tmp_path / "runs.jsonl"
    with pytest.raises(ConfigError, match="readers"):
        uffdkvm.sweep(BASE, readers=[1, 0], out=out, progress=False)
    with pytest.raises(ConfigError, match="not a Config field"):
        uffdkvm.sweep(BASE, reader=[1, 2], out=out, progress=False)
    with pytest.raises(ConfigError, match="trials") as info:
        uffdkvm.sweep(BASE, trials=0, out=out, progress=False)
    assert info.value.field is None  # an argument, not a Config field
    with pytest.raises(ConfigError, match="Config"):
        uffdkvm.sweep({"vcpus": 1}, progress=False)
    assert counted == [] and not out.exists()


def test_out_gets_every_run_and_a_rerun_skips_them(kvm, tmp_path, counted):
    out = tmp_path / "runs.jsonl"
    first = uffdkvm.sweep(BASE, readers=[1, 2], trials=2, out=out, progress=False)
    assert len(counted) == 4 and len(lines(out)) == 4
    results = uffdkvm.read_results(out)
    assert sorted(r.config.readers for r in results) == [1, 1, 2, 2]
    assert all(isinstance(r.host, uffdkvm.HostInfo) for r in results)

    # Everything is done: nothing runs, the frame comes from the file.
    again = uffdkvm.sweep(BASE, readers=[1, 2], trials=2, out=out, progress=False)
    assert len(counted) == 4 and len(lines(out)) == 4
    pd.testing.assert_frame_equal(again, first)

    # One more trial: only the new runs run; the old rows are unchanged.
    more = uffdkvm.sweep(BASE, readers=[1, 2], trials=3, out=out, progress=False)
    assert len(counted) == 6 and len(lines(out)) == 6
    assert len(more) == 6 and sorted(more["trial"]) == [0, 0, 1, 1, 2, 2]
    pd.testing.assert_frame_equal(more[more["trial"] < 2].reset_index(drop=True), first)

    # Fewer trials or a sub-grid: only the runs asked for.
    fewer = uffdkvm.sweep(BASE, readers=[2], trials=1, out=out, progress=False)
    assert len(counted) == 6 and len(fewer) == 1


def test_a_line_cut_off_mid_write_is_skipped(kvm, tmp_path):
    out = tmp_path / "runs.jsonl"
    uffdkvm.sweep(BASE, out=out, progress=False)
    with open(out, "a") as f:
        f.write('{"schema": 1, "config": {"vcp')  # the process died here
    with pytest.warns(SweepWarning, match=r"runs.jsonl:2: skipped"):
        df = uffdkvm.sweep(BASE, trials=2, out=out, progress=False)
    assert len(df) == 2 and df["error"].isna().all()
    assert len(lines(out)) == 3
    json.loads(lines(out)[2])  # the new run is a line of its own


def test_a_failed_run_is_recorded_and_the_sweep_goes_on(kvm, tmp_path, counted):
    out = tmp_path / "runs.jsonl"
    # 1T per vCPU is a valid Config, but run() refuses it on any host with
    # less memory: a run that raises.
    with pytest.warns(SweepWarning, match=r"1 of 3 runs failed .*HostUnsupportedError: mem_per_vcpu"):
        df = uffdkvm.sweep(BASE, mem_per_vcpu=["1M", "1T", "2M"], out=out, progress=False)
    assert list(df["error"].isna()) == [True, False, True]
    assert df["error"][1].startswith("HostUnsupportedError: mem_per_vcpu: the run would demand-page 1T")
    assert df["mem_per_vcpu"][1] == 1 << 40 and df["trial"][1] == 0
    assert pd.isna(df["pages_per_s"][1]) and df["pages_per_s"][2] > 0
    assert len(lines(out)) == 2  # failures are not in out ...
    with pytest.warns(SweepWarning, match="1 of 3 runs failed"):
        uffdkvm.sweep(BASE, mem_per_vcpu=["1M", "1T", "2M"], out=out, progress=False)
    assert [c.mem_per_vcpu for c in counted] == [1 << 20, 1 << 40, 2 << 20, 1 << 40]  # ... so retried


def test_any_exception_is_recorded(kvm, monkeypatch):
    real = sweep_module._run_point

    def flaky(config, token=""):
        if config.readers == 2:
            raise RuntimeError("boom")
        return real(config, token)

    monkeypatch.setattr(sweep_module, "_run_point", flaky)
    with pytest.warns(SweepWarning):
        df = uffdkvm.sweep(BASE, readers=[1, 2, 3], progress=False)
    assert list(df["error"].fillna("")) == ["", "RuntimeError: boom", ""]


def test_ctrl_c_stops_the_sweep_and_keeps_what_finished(kvm, tmp_path, monkeypatch):
    out = tmp_path / "runs.jsonl"
    real = sweep_module._run_point
    calls = []

    def interrupted(config, token=""):
        calls.append(config)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(config, token)

    monkeypatch.setattr(sweep_module, "_run_point", interrupted)
    with pytest.raises(KeyboardInterrupt):
        uffdkvm.sweep(BASE, readers=[1, 2, 3], out=out, progress=False)
    assert len(calls) == 2 and len(lines(out)) == 1
    monkeypatch.setattr(sweep_module, "_run_point", real)
    df = uffdkvm.sweep(BASE, readers=[1, 2, 3], out=out, progress=False)
    assert list(df["readers"]) == [1, 2, 3] and df["error"].isna().all()
    assert len(lines(out)) == 3


def test_progress_bar_on_stderr_only_when_asked(kvm, capsys):
    uffdkvm.sweep(BASE, readers=[1, 2])
    err = capsys.readouterr().err
    assert "sweep" in err and "2/2" in err
    uffdkvm.sweep(BASE, readers=[1, 2], progress=False)
    assert capsys.readouterr().err == ""


def test_an_executor_runs_the_points(kvm, tmp_path):
    out = tmp_path / "runs.jsonl"
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as executor:
        with pytest.warns(SweepWarning, match="2 of 6 runs failed"):
            df = uffdkvm.sweep(BASE, mem_per_vcpu=["1M", "1T", "2M"], trials=2, out=out,
                               executor=executor, progress=False)
    assert list(df[["mem_per_vcpu", "trial"]].itertuples(index=False, name=None)) == \
        list(itertools.product([1 << 20, 1 << 40, 2 << 20], [0, 1]))
    assert list(df["error"].isna()) == [True, True, False, False, True, True]
    assert len(lines(out)) == 4


def test_a_local_dask_cluster_runs_the_points(kvm, tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    out = tmp_path / "runs.jsonl"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None, silence_logs=logging.CRITICAL) \
            as cluster, distributed.Client(cluster) as client:
        kwargs = dict(readers=[1, 2], wait=["poll", "epoll"], trials=2, out=out,
                      executor=client.get_executor(), progress=False)
        df = uffdkvm.sweep(BASE, **kwargs)
        assert len(df) == 8 and df["error"].isna().all() and df["verified"].all()
        results = uffdkvm.read_results(out)
        assert len(results) == 8
        # Equal Configs are separate runs, not one cached task (dask's pure=True).
        assert len({r.vcpus[0].tid for r in results}) == 8
        again = uffdkvm.sweep(BASE, **kwargs)
        assert len(lines(out)) == 8
        pd.testing.assert_frame_equal(again, df)
