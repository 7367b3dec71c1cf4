"""The pytest plugin (uffdkvm.testing.pytest_plugin), run through pytester: inner
suites that use its fixtures and marker, with and without the plugin."""
import json
import os
import subprocess
import textwrap
import xml.etree.ElementTree as ET

import pandas  # noqa: F401 - loaded before pytester's in-process runs: a module
import pytest  # first loaded inside one is unloaded after it, and numpy cannot load twice

import uffdkvm
from helpers.children import ENV, python
from helpers.hostfacts import NO_GUEST_MEMFD

TINY = 'vcpus=1, mem_per_vcpu="64K"'


def _reasons(result):
    """{test name: skip reason} from an inner run's -rs summary."""
    reasons = {}
    for line in result.outlines:
        if line.startswith("SKIPPED [1] ") and "uffdkvm: " in line:
            where, reason = line[len("SKIPPED [1] "):].split(": ", 1)
            reasons[where] = reason
    return reasons


def test_the_entry_point_loads_the_plugin(pytester):
    result = pytester.runpytest("--help")
    assert "--uffdkvm-results" in result.stdout.str()
    result = pytester.runpytest("-p", "no:uffdkvm", "--help")
    assert "--uffdkvm-results" not in result.stdout.str()


@pytest.mark.alone  # reads the host's free huge pages twice: no other worker may move them
def test_a_count_the_host_cannot_give_skips_with_the_hosts_reason(pytester, kvm):
    host = uffdkvm.HostInfo.current()
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.uffdkvm_requires(cpus=4096)
        def test_cpus():
            pass

        @pytest.mark.uffdkvm_requires(hugepages=10**9)
        def test_hugepages():
            pass

        @pytest.mark.uffdkvm_requires(cpus={host.usable_cpus})
        def test_cpus_it_has():
            pass
    """)
    result = pytester.runpytest("-rs", "--strict-markers")
    result.assert_outcomes(passed=1, skipped=2)
    text = result.stdout.str()
    assert (f"needs 4096 CPUs; this process can run on {host.usable_cpus} of the host's "
            f"{host.cpus}") in text
    assert f"needs 1000000000 free 2 MiB huge pages; the host has {host.hugepages_2m_free}" \
        in text
    assert "> /proc/sys/vm/nr_hugepages" in text


def test_a_config_the_host_cannot_run_skips_with_probes_reason(pytester, kvm):
    # guest_memfd under userfaultfd is refused on every kernel (docs/backings.md); without
    # it guest_memfd runs wherever KVM makes one the host can mmap (the tests' own probe).
    with pytest.raises(uffdkvm.HostUnsupportedError) as refused:
        uffdkvm.probe(backing="guest_memfd", uffd_mode="missing", vcpus=1, mem_per_vcpu="4K")
    pytester.makepyfile("""
        import pytest

        @pytest.mark.uffdkvm_requires(backing="guest_memfd", uffd_mode="missing")
        def test_guest_memfd_missing():
            pass

        @pytest.mark.uffdkvm_requires(backing="guest_memfd", uffd_mode=None)
        def test_guest_memfd_without_uffd():
            pass
    """)
    result = pytester.runpytest("-rs")
    if NO_GUEST_MEMFD.holds:
        result.assert_outcomes(skipped=2)
    else:
        result.assert_outcomes(passed=1, skipped=1)
    assert f"backing='guest_memfd', uffd_mode='missing': {refused.value}" \
        in result.stdout.str()


def test_a_named_feature_runs_where_the_host_has_it(pytester, kvm):
    # backing_support() is the independent record of what MINOR on shmem needs
    has_minor_shmem = uffdkvm.backing_support()["shmem"]["minor"] is None
    pytester.makepyfile("""
        import pytest

        @pytest.mark.uffdkvm_requires("minor_shmem", "move", "io_uring", "wp_async")
        def test_features(uffdkvm_run):
            assert uffdkvm_run(vcpus=1, mem_per_vcpu="64K", backing="shmem",
                               uffd_mode="minor").verified
    """)
    result = pytester.runpytest("-rs")
    support = uffdkvm.fault_path_support()
    has_all = (has_minor_shmem and support["resolve"]["move"] is None
               and support["wait"]["io_uring"] is None)
    if has_all:
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(skipped=1)


def test_a_kvm_capability_feature_is_kvms_answer(pytester, kvm):
    # The dirty ring asked of /dev/kvm here, by hand, as the record to match.
    import fcntl
    fd = os.open("/dev/kvm", os.O_RDWR)
    try:
        ring_bytes = fcntl.ioctl(fd, 0xAE03, 192)  # KVM_CHECK_EXTENSION(KVM_CAP_DIRTY_LOG_RING)
    finally:
        os.close(fd)
    pytester.makepyfile("""
        import pytest

        @pytest.mark.uffdkvm_requires("dirty_ring")
        def test_ring():
            pass
    """)
    result = pytester.runpytest("-rs")
    if ring_bytes > 0:
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(skipped=1)
        result.stdout.fnmatch_lines(["*KVM_CAP_DIRTY_LOG_RING*"])


def test_a_capability_kvm_lacks_is_missing_with_its_name():
    from uffdkvm.testing.pytest_plugin import kvm_cap_missing
    # No KVM numbers a capability this high: KVM_CHECK_EXTENSION answers 0.
    why = kvm_cap_missing("KVM_CAP_NOT_ONE", 1 << 20)
    assert why is not None and "KVM_CAP_NOT_ONE" in why and "answers 0" in why
    why = kvm_cap_missing("KVM_CAP_DIRTY_LOG_RING", 192, path="/nonexistent/kvm")
    assert why is not None and "cannot open /nonexistent/kvm" in why


@pytest.mark.parametrize("marker, says", [
    ('"frobnicate"', "unknown feature 'frobnicate' (known: move, wp_async"),
    ("readerz=4", "unexpected keyword argument 'readerz'"),
    ("readers=0", "readers"),
    ("cpus=0", "cpus=0: a count, an int of at least 1"),
    ('hugepages="4"', "hugepages='4': a count"),
])
def test_an_unknown_feature_or_field_is_a_usage_error_at_collection(pytester, marker, says):
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.uffdkvm_requires({marker})
        def test_it():
            raise AssertionError("ran")
    """)
    result = pytester.runpytest("--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "test_it: @pytest.mark.uffdkvm_requires: " in err
    assert says in err


def test_the_marker_is_registered_for_strict_markers(pytester):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.uffdkvm_requires(cpus=1)
        def test_known():
            pass

        @pytest.mark.uffdkvm_require(cpus=1)
        def test_misspelt():
            pass
    """)
    result = pytester.runpytest("--strict-markers", "--collect-only")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*'uffdkvm_require' not found in `markers`*"])
    assert "uffdkvm_requires' not found" not in result.stdout.str()
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.uffdkvm_requires(*features, **fields): *"])


_RECORDING_SUITE = f"""
    import json

    def test_two_runs(uffdkvm_run):
        for readers in (1, 2):
            r = uffdkvm_run({TINY}, readers=readers)
            with open(OUT, "a") as f:
                f.write(json.dumps({{"nodeid": "test_recorded.py::test_two_runs",
                                     "readers": readers, "faults": r.faults,
                                     "pages_per_s": r.paging_rate}}) + "\\n")

    def test_one_run(uffdkvm_run):
        r = uffdkvm_run(uffdkvm.Config({TINY}, readers=3))
        with open(OUT, "a") as f:
            f.write(json.dumps({{"nodeid": "test_recorded.py::test_one_run", "readers": 3,
                                 "faults": r.faults, "pages_per_s": r.paging_rate}}) + "\\n")

    def test_no_run():
        pass
"""


def _recording_suite(pytester):
    out = pytester.path / "independent.jsonl"
    pytester.makepyfile(test_recorded=f"import uffdkvm\nOUT = {str(out)!r}\n"
                        + textwrap.dedent(_RECORDING_SUITE))
    return out


def _independent(out):
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_results_file_has_one_line_per_run_and_load_results_reads_it(pytester, kvm):
    out = _recording_suite(pytester)
    path = pytester.path / "runs.jsonl"
    path.write_text("stale line from an earlier session\n")
    result = pytester.runpytest(f"--uffdkvm-results={path}")
    result.assert_outcomes(passed=3)
    seen = _independent(out)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 3 == len(seen)
    for line, run in zip(lines, seen):
        assert line["nodeid"] == run["nodeid"]
        assert line["config"]["readers"] == run["readers"] == line["result"]["config"]["readers"]
        assert line["host"]["kernel_release"] == uffdkvm.HostInfo.current().kernel_release
        assert line["result"]["faults"] == run["faults"]
    df = uffdkvm.load_results(path)
    assert list(df["nodeid"]) == [run["nodeid"] for run in seen]
    assert list(df["readers"]) == [run["readers"] for run in seen]
    assert list(df["faults"]) == [run["faults"] for run in seen]
    assert list(df["pages_per_s"]) == pytest.approx([run["pages_per_s"] for run in seen])


def test_load_results_names_the_line_that_is_not_a_record(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text('\n{"nodeid": "t.py::t", "config": {}}\n')
    with pytest.raises(uffdkvm.ResultError, match=r"runs.jsonl:2: not a line that pytest "
                                                  r"--uffdkvm-results writes: KeyError"):
        uffdkvm.load_results(path)
    (tmp_path / "empty.jsonl").write_text("")
    assert list(uffdkvm.load_results(tmp_path / "empty.jsonl").columns) == ["nodeid"]


def test_junit_xml_carries_the_properties(pytester, kvm):
    out = _recording_suite(pytester)
    xml = pytester.path / "junit.xml"
    result = pytester.runpytest(f"--junitxml={xml}")
    result.assert_outcomes(passed=3)
    seen = {}
    for run in _independent(out):
        seen.setdefault(run["nodeid"].split("::")[1], []).append(run)
    cases = {case.get("name"): case for case in ET.parse(xml).getroot().iter("testcase")}
    assert cases["test_no_run"].find("properties") is None
    for name, runs in seen.items():
        props = [(p.get("name"), p.get("value"))
                 for p in cases[name].find("properties").iter("property")]
        want = []
        for i, run in enumerate(runs):
            want += [(f"uffdkvm[{i}].pages_per_s", None), (f"uffdkvm[{i}].faults",
                     str(run["faults"])), (f"uffdkvm[{i}].seconds", None),
                     (f"uffdkvm[{i}].verified", "True")]
        assert [n for n, _ in props] == [n for n, _ in want]
        for (_, value), (n, wanted), in zip(props, want):
            if wanted is not None:
                assert value == wanted, n
        rates = [float(v) for n, v in props if n.endswith(".pages_per_s")]
        assert rates == pytest.approx([run["pages_per_s"] for run in runs])


_PLAIN_SUITE = """
    import pytest

    @pytest.fixture
    def broken():
        raise RuntimeError("fixture")

    def test_pass():
        pass

    def test_fail():
        assert 0

    def test_skip():
        pytest.skip("mine")

    @pytest.mark.xfail
    def test_xfail():
        assert 0

    def test_error(broken):
        pass

    @pytest.mark.parametrize("x", [1, 2])
    def test_param(x, record_property):
        record_property("x", x)

    def test_zz_the_plugin_ran_nothing():
        import sys
        plugin = sys.modules.get("uffdkvm.testing.pytest_plugin")
        if plugin is not None:
            for probe in (plugin._kvm_unusable, plugin._feature_missing,
                          plugin._config_refused):
                assert probe.cache_info().misses == 0, probe
"""


def test_the_plugin_changes_nothing_for_a_suite_that_does_not_use_it(pytester):
    pytester.makepyfile(_PLAIN_SUITE)
    outcomes = {}
    for args in ((), ("-p", "no:uffdkvm")):
        result = pytester.runpytest_subprocess("-rA", "--strict-markers", *args)
        outcomes[args] = (result.ret, result.parseoutcomes(),
                          sorted(line for line in result.outlines
                                 if line.startswith(("PASSED", "FAILED", "SKIPPED",
                                                     "XFAIL", "ERROR"))))
    with_plugin, without = outcomes.values()
    assert with_plugin == without
    assert with_plugin[1] == {"passed": 4, "failed": 1, "skipped": 1, "xfailed": 1,
                              "errors": 1}


def test_the_plugin_imports_nothing_heavy():
    code = ("import sys, uffdkvm.testing.pytest_plugin; "
            "print(sorted(m for m in ('pandas', 'numpy', 'scipy') if m in sys.modules))")
    out = subprocess.run(python(code=code), env=ENV, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_uffdkvm_host_is_this_hosts_hostinfo(pytester, kvm):
    host = uffdkvm.HostInfo.current()
    pytester.makepyfile(f"""
        import uffdkvm

        def test_host(uffdkvm_host):
            assert isinstance(uffdkvm_host, uffdkvm.HostInfo)
            assert uffdkvm_host.kernel_release == {host.kernel_release!r}
            assert uffdkvm_host.kvm_module == {host.kvm_module!r}
    """)
    pytester.runpytest("-rs").assert_outcomes(passed=1)


def test_a_field_whose_value_does_not_hash_is_probed(pytester, kvm):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.uffdkvm_requires(vcpus=1, pin_vcpus=[0])
        def test_pinned():
            pass

        @pytest.mark.uffdkvm_requires(vcpus=1, pin_vcpus=[1000])
        def test_pinned_to_a_cpu_it_lacks():
            pass
    """)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=1)
    assert ("pin_vcpus=[1000], vcpus=1: pin_vcpus: CPU 1000 is not one this process may run on"
            in result.stdout.str())
