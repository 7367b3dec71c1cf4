"""What uffdkvm raises: every exception a UffdkvmError, ConfigError naming its
field, host conditions as HostUnsupportedError, and every error whole after
a trip through another process (pickle)."""
import concurrent.futures
import pathlib
import pickle

import pytest

import uffdkvm
from helpers.hostfacts import KVM_TAKES_EVERY_CONFIG_VCPUS, host_skip
from helpers.skips import skip_without_kvm
from uffdkvm import (
    Config,
    ConfigError,
    Histogram,
    HostUnsupportedError,
    MissingDependencyError,
    Result,
    ResultError,
    RunError,
    RunTimeoutError,
    UffdkvmError,
)

ERRORS = [
    UffdkvmError("base", 5),
    ConfigError("vcpus: must be at least 1, not 0", field="vcpus"),
    ConfigError("from the core", 22, field="mem_per_vcpu"),
    ResultError("$.seconds: expected float, not 'fast'"),
    HostUnsupportedError("no /dev/kvm", 2),
    RunError("vCPU 0: KVM_RUN: EFAULT", 14),
    RunTimeoutError("the run did not finish within timeout_s=0.200", 110),
    MissingDependencyError("DataFrames need pandas: pip install 'uffdkvm[analysis]'"),
]
ERRORS[-1].name = "pandas"


def attributes(e):
    return (type(e), str(e), e.args, e.message, e.errno, getattr(e, "field", "none"),
            getattr(e, "name", "none"))


def raise_it(e):
    """Raised in a worker process: what comes back was pickled there."""
    raise e


def test_errors_cross_a_process_pool_whole():
    with concurrent.futures.ProcessPoolExecutor(max_workers=1) as pool:
        for e in ERRORS:
            with pytest.raises(UffdkvmError) as info:
                pool.submit(raise_it, e).result(timeout=60)
            assert attributes(info.value) == attributes(e)


def test_a_timeout_keeps_its_errno_and_stays_a_timeout_error():
    e = pickle.loads(pickle.dumps(RunTimeoutError("late", 110)))
    assert isinstance(e, TimeoutError) and isinstance(e, RunError)
    assert e.errno == 110 and str(e) == "late"


def test_the_hierarchy_keeps_the_builtin_bases():
    assert issubclass(ConfigError, ValueError) and issubclass(ResultError, ValueError)
    assert issubclass(RunTimeoutError, TimeoutError)
    assert issubclass(MissingDependencyError, ImportError)
    for cls in (ConfigError, ResultError, HostUnsupportedError, RunError, RunTimeoutError,
                MissingDependencyError):
        assert issubclass(cls, UffdkvmError)


NO_PANDAS = """
import sys, uffdkvm
sys.modules["pandas"] = None  # as if it were not installed: import raises ImportError
r = uffdkvm.run(vcpus=1, mem_per_vcpu="64K")
try:
    r.to_frame()
except uffdkvm.MissingDependencyError as e:
    print("MissingDependencyError", isinstance(e, ImportError), e)
"""


def test_a_missing_pandas_is_a_uffdkvm_error_and_an_import_error(kvm):
    import subprocess

    from helpers.children import ENV, python
    p = subprocess.run(python(code=NO_PANDAS), capture_output=True, text=True,
                       timeout=120, env=ENV)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("MissingDependencyError True DataFrames need pandas"), p.stdout


def test_config_error_names_the_field():
    with pytest.raises(ConfigError) as info:
        Config(readers=0)
    assert info.value.field == "readers"
    with pytest.raises(ConfigError) as info:
        Config().replace(reader=2)
    assert info.value.field is None  # not a field at all


def test_a_config_error_from_the_core_names_its_field(kvm):
    limit = uffdkvm.HostInfo.current().kvm_caps.get("max_vcpus")
    if not limit or limit >= 4096:
        host_skip(KVM_TAKES_EVERY_CONFIG_VCPUS, "KVM takes every vCPU count a Config allows")
    with pytest.raises(ConfigError) as info:
        uffdkvm.run(vcpus=limit + 1, mem_per_vcpu="4K")
    assert info.value.field == "vcpus"


def bad_calls(result):
    """Wrong arguments and wrong data, to every part of the API."""
    trace_less = result
    h = Histogram.empty((0, 1, 2))
    return {
        "sweep(trials=0)": lambda: uffdkvm.sweep(trials=0, progress=False),
        "sweep(base=dict)": lambda: uffdkvm.sweep({"vcpus": 1}, progress=False),
        "run(dict)": lambda: uffdkvm.run({"vcpus": 1}),
        "faults_frame without trace": trace_less.faults_frame,
        "Histogram counts": lambda: Histogram((0, 1, 2), (1, 1), 3, 0, 0, 0),
        "Histogram bounds": lambda: Histogram((0, 1), (1, 1), 2, 0, 0, 0),
        "Histogram percentile": lambda: h.percentile(101),
        "Histogram add": lambda: h + Histogram.empty((0, 1, 3)),
        "from_json not JSON": lambda: Result.from_json("nope"),
        "from_json not an object": lambda: Result.from_json("[]"),
        "from_json schema": lambda: Result.from_json('{"schema": 99}'),
        "from_json missing": lambda: Result.from_json('{"schema": 4}'),
        "spread_of string": lambda: uffdkvm.spread_of("123"),
        "spread_of confidence": lambda: uffdkvm.spread_of([1, 2], confidence=2),
        "ratio_of zero": lambda: uffdkvm.ratio_of([1, 2], [0, 0]),
        "ratio_of pairs": lambda: uffdkvm.ratio_of([1], [1, 2], paired=True),
        "summarize column": lambda: uffdkvm.summarize(result.to_frame(), "rate"),
        "parse_size": lambda: uffdkvm.parse_size("lots"),
        "progress": lambda: uffdkvm.run(progress="yes"),
    }


@pytest.fixture(scope="module")
def result(kvm_reason):
    skip_without_kvm(kvm_reason)
    return uffdkvm.run(vcpus=1, mem_per_vcpu="64K")


def test_every_bad_call_raises_a_uffdkvm_error(result):
    for name, call in bad_calls(result).items():
        with pytest.raises(Exception) as info:
            call()
        assert isinstance(info.value, UffdkvmError), (name, type(info.value), info.value)
        assert isinstance(info.value, ValueError), name  # bad arguments or data


def test_the_package_raises_no_bare_builtin_errors():
    """A source check beside the behaviour above: no `raise ValueError(` or
    `raise TypeError(` left in the package (the CLI's files aside: they
    report through exit codes)."""
    root = pathlib.Path(uffdkvm.__file__).parent
    found = []
    for path in sorted(root.glob("*.py")):
        if path.name.startswith("cli") or path.name in ("__main__.py", "_testing.py"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if any(f"raise {b}(" in line for b in ("ValueError", "TypeError", "RuntimeError")):
                found.append(f"{path.name}:{n}: {line.strip()}")
    assert not found, found


def test_host_conditions_are_host_errors_not_config_errors():
    """A valid Config this host cannot hold (a region past its memory): the
    same Config runs on a larger host, so it is no ConfigError."""
    with pytest.raises(HostUnsupportedError) as info:
        uffdkvm.run(vcpus=64, mem_per_vcpu="64G")
    assert not isinstance(info.value, ConfigError)
    assert str(info.value).startswith("mem_per_vcpu: ")
