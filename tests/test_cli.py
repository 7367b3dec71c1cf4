"""The command line: upstream's three lines, the tables, JSON, exit codes."""
import json
import re
import subprocess
import sys

import pytest

import uffdkvm
from children import ENV as CHILD_ENV
from uffdkvm import cli

pytestmark = pytest.mark.kvm


def uffdkvm_cli(*args):
    # Run from / so that the installed package is imported, not the source tree.
    return subprocess.run([sys.executable, "-m", "uffdkvm", *args], capture_output=True,
                          text=True, timeout=120, cwd="/", env=CHILD_ENV)


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


@pytest.mark.parametrize("args", [["-u", "WP"], ["-s", "tmpfs"], ["--wait", "select"]])
def test_unknown_choices_are_argparse_errors(args):
    p = uffdkvm_cli(*args)
    assert p.returncode == 2
    assert "usage:" in p.stderr


def test_main_is_importable_and_returns_a_code(kvm, capsys):
    assert cli.main(["-b", "1M", "-r", "2"]) == 0
    assert capsys.readouterr().out.startswith("Total guest execution time:")
