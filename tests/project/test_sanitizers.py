"""The C core under sanitizers: the programs in tests/c, built with the core
and run by ``make -C tests/c check-asan`` (AddressSanitizer, UndefinedBehavior-
Sanitizer and LeakSanitizer) and ``check-tsan`` (ThreadSanitizer).

Each sanitizer's set is built and run once (with the huge page pools grown,
as root, for the hugetlb program; as many programs at once as there are CPUs); each program is a test here, that fails
on the program's failure or any sanitizer report and shows its output. A
program either runs every case or skips as a whole (exit 77) for a reason
that a host fact explains: without KVM or userfaultfd any of them, without
huge pages hugetlb. A program that passed with some cases skipped fails
here unless a host fact that holds explains every one (CASE_SKIP_FACTS:
a kernel without UFFDIO_MOVE, or without asynchronous write-protect, skips
those cases and runs the rest). Without a C compiler, make or the
sanitizer runtime, the tests skip citing that.
"""
import glob
import os
import re
import subprocess
from pathlib import Path

import pytest

from helpers.hostfacts import (NO_ASAN_RUNTIME, NO_CC, NO_HUGEPAGES_2M, NO_TSAN_RUNTIME,
                               NO_UFFD_MOVE, NO_UFFD_WP_ASYNC, host_skip, missing_tool)
from helpers.skips import KVM_FACTS

# slow: each set is built (the core and every program) and run, under its sanitizer
pytestmark = [pytest.mark.kvm, pytest.mark.slow]

C_TESTS = Path(__file__).resolve().parents[1] / "c"
VARIANTS = ("asan", "tsan")
TOOLCHAIN_FACTS = {
    "asan": (NO_CC, missing_tool("make"), NO_ASAN_RUNTIME),
    "tsan": (NO_CC, missing_tool("make"), NO_TSAN_RUNTIME),
}
# Why a program may skip as a whole beyond KVM_FACTS (its own check, exit 77).
SKIP_FACTS = {
    "hugetlb": (NO_HUGEPAGES_2M,),
}
# Why a case may skip while the rest of its program runs: words of the
# core's own refusal, and the host fact that must hold for them.
CASE_SKIP_FACTS = (
    ("has no UFFDIO_MOVE", NO_UFFD_MOVE),
    ("no asynchronous write-protect (UFFD_FEATURE_WP_ASYNC", NO_UFFD_WP_ASYNC),
)
LINE = re.compile(r"^(PASS|FAIL|SKIP) (\S+) \[(asan|tsan)\] \([\d.]+s\)(?:: (.*))?$", re.M)


def programs(variant):
    """The program set of a variant, as the Makefile says (every .c file
    where make is missing: those tests skip anyway)."""
    try:
        p = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(C_TESTS),
                            f"list-{variant}"], capture_output=True, text=True, timeout=60)
        if p.returncode == 0 and p.stdout.split():
            return p.stdout.split()
    except OSError:
        pass
    return sorted(Path(f).stem for f in glob.glob(str(C_TESTS / "*.c")))


@pytest.fixture(scope="module")
def c_build(tmp_path_factory):
    """Where make builds the programs and keeps their logs (its BUILD): a
    temporary directory, never the source tree, which may be read-only."""
    return tmp_path_factory.mktemp("c-build")


@pytest.fixture(scope="module")
def sanitizer_runs(hugepages, c_build):
    """variant -> (make's output, {program: (status, why)}), each set built
    and run once, on first use."""
    runs = {}

    def get(variant):
        if variant not in runs:
            facts = TOOLCHAIN_FACTS[variant]
            if any(f.holds for f in facts):
                runs[variant] = facts
            else:
                cpus = os.cpu_count() or 1
                cmd = ["make", "-s", "--no-print-directory", "-C", str(C_TESTS),
                       f"BUILD={c_build}", f"-j{cpus}", f"check-{variant}"]
                # The programs mostly wait: as many at once as there are CPUs.
                env = {**os.environ, "UKVM_TEST_JOBS": str(cpus)}
                p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env=env, timeout=2400)  # a TCG guest's build: slow
                print(p.stdout)  # the PASS/SKIP lines, for pytest -rP or -s
                status = {m.group(2): (m.group(1), m.group(4) or "")
                          for m in LINE.finditer(p.stdout) if m.group(3) == variant}
                runs[variant] = (" ".join(cmd), p.stdout, status)
        return runs[variant]
    return get


@pytest.mark.parametrize("variant,program",
                         [(v, p) for v in VARIANTS for p in programs(v)])
def test_c_program_under_sanitizer(kvm, sanitizer_runs, c_build, variant, program):
    run = sanitizer_runs(variant)
    if all(hasattr(f, "holds") for f in run):  # the toolchain facts
        host_skip(run, f"cannot build the {variant} programs")
    cmd, output, status = run
    if program not in status:
        pytest.fail(f"{cmd} did not run {program}:\n{output[-5000:]}", pytrace=False)
    result, why = status[program]
    log = c_build / variant / f"{program}.log"
    if result == "FAIL":
        text = log.read_text() if log.exists() else output
        pytest.fail(f"{program} [{variant}] failed ({why}):\n{text[-20000:]}", pytrace=False)
    if result == "SKIP":
        host_skip(KVM_FACTS + SKIP_FACTS.get(program, ()), f"{program} [{variant}]: {why}")
    if why:  # passed, with some cases skipped
        skipped = [line for line in log.read_text().splitlines() if "] skipped: " in line]
        unexplained = [line for line in skipped if not any(
            words in line and fact.holds for words, fact in CASE_SKIP_FACTS)]
        if not unexplained:
            return
        skipped = unexplained
        pytest.fail(f"{program} [{variant}] passed with {why}: a program runs every case, or "
                    f"skips as a whole (exit 77) for a reason SKIP_FACTS maps to a host fact:\n"
                    + "\n".join(skipped), pytrace=False)
