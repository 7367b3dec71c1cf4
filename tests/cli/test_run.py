"""The command line: upstream's three lines, the tables, JSON, exit codes."""
import json
import os
import re
import subprocess

import pytest

import uffdkvm
from helpers.children import ENV as CHILD_ENV
from helpers.children import uffdkvm_command
from helpers.hostfacts import cpus_unavailable, host_skip
from uffdkvm import cli

pytestmark = pytest.mark.kvm


def uffdkvm_cli(*args):
    # Run from / so that the installed package is imported, not the source tree.
    return subprocess.run(uffdkvm_command(*args), capture_output=True,
                          text=True, timeout=120, env=CHILD_ENV)


def test_text_output_starts_with_upstreams_three_lines(kvm):
    p = uffdkvm_cli("-u", "MISSING", "-v", "2", "-b", "16M", "-r", "2")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert re.fullmatch(r"Total guest execution time:\t\d+\.\d{9}s", lines[0])
    per_vcpu = float(re.fullmatch(r"Per-vcpu demand paging rate:\t([\d.]+) pgs/sec/vcpu",
                                  lines[1]).group(1))
    overall = float(re.fullmatch(r"Overall demand paging rate:\t([\d.]+) pgs/sec",
                                 lines[2]).group(1))
    assert overall == pytest.approx(2 * per_vcpu, rel=1e-5)
    assert "Memory verified:\t8192 pages" in p.stdout
    # One row per vCPU and per reader (2 uffds x 2 readers) under their headers.
    vcpu_rows = section(p.stdout, "vCPUs:")
    reader_rows = section(p.stdout, "Readers (epoll_exclusive, 2 uffd(s) x 2):")
    assert [(row.split()[0], row.split()[2]) for row in vcpu_rows[1:]] == [("0", "4096"),
                                                                         ("1", "4096")]
    assert vcpu_rows[0].split()[:3] == ["vcpu", "seconds", "pages"]
    assert [row.split()[:2] for row in reader_rows[1:]] == [["0", "0"], ["0", "1"],
                                                         ["1", "0"], ["1", "1"]]
    assert sum(int(row.split()[2]) for row in reader_rows[1:]) == 8192
    assert "Total faults resolved: 8192" in p.stdout
    assert re.search(r"^Blocktime \(every vCPU blocked at once\): [\d.]+s$", p.stdout, re.M)


def section(text, header):
    """The lines of the table under header, up to the next blank line."""
    lines = text.splitlines()
    start = lines.index(header) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return [line for line in lines[start:end] if line.startswith(" ") or line[:1].islower()]


def test_json_output_is_the_result(kvm):
    p = uffdkvm_cli("-u", "minor", "-s", "shmem", "-o", "-v", "2", "-b", "8M", "-r", "3",
                    "--wait", "poll", "--json")
    assert p.returncode == 0, p.stderr
    # One line of Result.to_json(), the form sweep --out writes, not indented
    # to_dict() (millions of lines with --trace-faults).
    assert p.stdout.count("\n") == 1
    r = uffdkvm.Result.from_json(p.stdout)
    assert p.stdout == r.to_json() + "\n"
    d = json.loads(p.stdout)
    assert d["verified"] is True
    assert d["faults"] == 2048
    assert d["config"] == uffdkvm.Config(
        vcpus=2, mem_per_vcpu="8M", backing="shmem", uffd_mode="minor", readers=3,
        wait="poll", overlap=True).to_dict()
    assert len(d["readers"]) == 3 and len(d["vcpus"]) == 2


def test_no_userfaultfd(kvm):
    p = uffdkvm_cli("-u", "NONE", "-b", "8M", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["config"]["uffd_mode"] is None and d["readers"] == [] and d["verified"]


@pytest.mark.parametrize("args,message", [
    (["-u", "MINOR"], "uffd_mode: 'minor' needs a shared backing"),
    (["-b", "12Q"], "mem_per_vcpu"),
    (["-v", "0"], "vcpus"),
])
def test_bad_arguments_exit_2_with_the_field_named(args, message):
    p = uffdkvm_cli(*args)
    assert p.returncode == cli.EXIT_USAGE
    assert message in p.stderr


@pytest.mark.parametrize("args", [["-u", "WRITEPROTECT"], ["-s", "tmpfs"], ["--wait", "select"]])
def test_unknown_choices_are_argparse_errors(args):
    p = uffdkvm_cli(*args)
    assert p.returncode == 2
    assert "usage:" in p.stderr


def test_main_is_importable_and_returns_a_code(kvm, capsys):
    assert cli.main(["-b", "1M", "-r", "2"]) == 0
    assert capsys.readouterr().out.startswith("Total guest execution time:")


def test_version():
    p = uffdkvm_cli("--version")
    assert p.returncode == 0
    assert p.stdout == f"uffdkvm {uffdkvm.__version__}\n"


@pytest.mark.parametrize("upstream,ours", [
    ("anonymous", "anonymous"), ("anonymous_thp", "anonymous_thp"),
    ("anonymous_hugetlb", "anonymous_hugetlb"), ("anonymous_hugetlb_2mb", "anonymous_hugetlb"),
    ("anonymous_hugetlb_1gb", "anonymous_hugetlb_1gb"), ("shmem", "shmem"),
    ("shared_hugetlb", "shared_hugetlb"), ("SHMEM", "shmem"), ("guest_memfd", "guest_memfd"),
])
def test_upstreams_backing_names_are_taken(upstream, ours):
    assert cli.build_parser().parse_args(["-s", upstream]).backing == ours


def test_every_upstream_backing_name_is_taken_or_refused_by_name():
    # The names upstream's demand_paging_test -h lists (lib/test_util.c).
    upstream = ["anonymous", "anonymous_thp", "anonymous_hugetlb"] + [
        f"anonymous_hugetlb_{size}" for size in ("16kb", "64kb", "512kb", "1mb", "2mb", "8mb",
                                                 "16mb", "32mb", "256mb", "512mb", "1gb", "2gb",
                                                 "16gb")] + ["shmem", "shared_hugetlb"]
    taken = [name for name in upstream if name in ("anonymous", "anonymous_thp",
                                                   "anonymous_hugetlb", "anonymous_hugetlb_2mb",
                                                   "anonymous_hugetlb_1gb", "shmem",
                                                   "shared_hugetlb")]
    assert len(taken) == 7
    for name in set(upstream) - set(taken):
        p = uffdkvm_cli("-s", name)
        assert p.returncode == cli.EXIT_USAGE
        size = name.rpartition("_")[2]
        assert (f"argument -s: '{name}': upstream's backing with {size[:-2]} "
                f"{size[-2].upper()}iB huge pages is not one uffdkvm has") in p.stderr
        assert "use anonymous_hugetlb_2mb" in p.stderr


def test_upstream_backing_name_runs(kvm):
    p = uffdkvm_cli("-s", "anonymous", "-b", "1M", "--json")
    assert p.returncode == 0, p.stderr
    assert uffdkvm.Result.from_json(p.stdout).config.backing == "anonymous"


def test_guest_mode_9_runs_and_the_others_are_refused(kvm):
    p = uffdkvm_cli("-m", "9", "-m", "9", "-b", "1M")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("Total guest execution time:")
    for mode, name in (("0", "PA-bits:52,  VA-bits:48,  4K pages"),
                       ("10", "PA-bits:47,  VA-bits:64,  4K pages")):
        p = uffdkvm_cli("-m", mode, "-b", "1M")
        assert p.returncode == cli.EXIT_USAGE
        assert (f"argument -m: guest mode {mode} ({name}) is not supported: uffdkvm runs "
                "x86-64 guests in mode 9 only (PA-bits:ANY, VA-bits:48,  4K pages") in p.stderr
    p = uffdkvm_cli("-m", "x")
    assert p.returncode == cli.EXIT_USAGE and "'x' is not a guest mode ID" in p.stderr
    assert "9 is the one uffdkvm runs" in p.stderr
    # -h lists it as upstream's does.
    assert "uffdkvm runs mode 9 only (PA-bits:ANY, VA-bits:48, 4K pages)" in \
        " ".join(uffdkvm_cli("-h").stdout.split())


def test_c_pins_one_cpu_per_vcpu_and_the_extra_one_pins_the_main_thread(kvm):
    if cpus_unavailable(0, 1).holds:
        host_skip(cpus_unavailable(0, 1), "needs CPUs 0 and 1")
    parent_cpus = os.sched_getaffinity(0)
    for vcpu_cpu, main_cpu in ((0, 1), (1, 0)):
        p = uffdkvm_cli("-v", "1", "-c", f"{vcpu_cpu},{main_cpu}", "-b", "1M", "--json")
        assert p.returncode == 0, p.stderr
        r = uffdkvm.Result.from_json(p.stdout)
        assert list(r.config.pin_vcpus) == [vcpu_cpu]
        assert list(r.vcpus[0].cpus) == [vcpu_cpu]
        # The readers are started by the main thread and inherit its one CPU.
        assert [list(x.cpus) for x in r.readers] == [[main_cpu]]
        # HostInfo was taken before the pinning: the CPUs the command was given.
        assert r.host.usable_cpus == len(parent_cpus)
    # Without the extra entry the main thread stays free, and the readers
    # run with their vCPUs (the default with pinned vCPUs, issue 21) ...
    p = uffdkvm_cli("-v", "2", "-c", "1,0", "-b", "1M", "--json")
    assert p.returncode == 0, p.stderr
    r = uffdkvm.Result.from_json(p.stdout)
    assert [list(v.cpus) for v in r.vcpus] == [[1], [0]]
    assert [set(x.cpus) for x in r.readers] == [{1}, {0}]
    # ... unless told to stay where the scheduler puts them, as upstream's do.
    p = uffdkvm_cli("-v", "2", "-c", "1,0", "-b", "1M", "--pin-readers", "scheduler", "--json")
    assert p.returncode == 0, p.stderr
    r = uffdkvm.Result.from_json(p.stdout)
    assert [set(x.cpus) for x in r.readers] == [parent_cpus, parent_cpus]


@pytest.mark.parametrize("args,message", [
    (["-v", "2", "-c", "0"], "-c: 1 CPUs for 2 vCPU(s): give one per vCPU (2), plus optionally "
                             "one for the main thread (3)"),
    (["-v", "1", "-c", "0,1,0"], "-c: 3 CPUs for 1 vCPU(s)"),
    (["-c", "0", "--pin-vcpus", "0"], "not allowed with argument -c"),
])
def test_c_with_the_wrong_count_is_a_usage_error(args, message):
    p = uffdkvm_cli(*args)
    assert p.returncode == cli.EXIT_USAGE
    assert message in p.stderr


def test_pin_vcpus_is_round_robin(kvm):
    if cpus_unavailable(0, 1).holds:
        host_skip(cpus_unavailable(0, 1), "needs CPUs 0 and 1")
    p = uffdkvm_cli("-v", "3", "--pin-vcpus", "1,0", "-b", "1M", "--json")
    assert p.returncode == 0, p.stderr
    r = uffdkvm.Result.from_json(p.stdout)
    assert [list(v.cpus) for v in r.vcpus] == [[1], [0], [1]]

