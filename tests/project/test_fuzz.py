"""The fuzz targets (tests/fuzz/, docs/robustness.md "Fuzzing"): the
parsers of what comes from outside, under ASan and UBSan.

The libFuzzer targets (the client's reply parser, the server's request
parser, the handshake's records, addresses) and the atheris ones (the binding's config dict, the
touch-order reader), as tests/fuzz/Makefile lists them, are built once in a
temporary directory; then each:

- replays every input committed in its corpus (seeds, and the regression
  input of every finding fixed), each of which must pass;
- fuzzes for a few seconds (UFFDKVM_FUZZ_SECONDS, default 4) from that
  corpus, and must end without a finding.

A failure shows libFuzzer's log with the finding's report; the input is
left in the test's temporary directory (crash-*). Longer runs:
benchmarks/fuzz.sh. Without clang-14's libFuzzer (.ci/run installs clang-14
and libclang-rt-14-dev) or atheris (the test extra), the tests skip citing
that.
"""
import mmap
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.hostfacts import NO_LIBFUZZER, host_skip, missing_module, missing_tool

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
SECONDS = int(os.environ.get("UFFDKVM_FUZZ_SECONDS", "4"))


def make_list(what):
    """A target list as the Makefile says (none where make is missing: then they skip)."""
    try:
        p = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(FUZZ), what],
                           capture_output=True, text=True, timeout=60)
    except OSError:
        return []
    return p.stdout.split() if p.returncode == 0 else []


C_TARGETS = make_list("list")
PY_TARGETS = make_list("list-atheris")


def test_every_target_has_a_corpus_and_the_makefile_lists_them():
    """A target without seeds would start from nothing, and one left out of
    the Makefile's lists would run nowhere."""
    sources = {p.stem for p in FUZZ.glob("*.c")} | {p.stem for p in FUZZ.glob("*.py")}
    assert sources == set(C_TARGETS) | set(PY_TARGETS), (sources, C_TARGETS, PY_TARGETS)
    for t in sources:
        corpus = FUZZ / "corpus" / t
        assert corpus.is_dir() and len(list(corpus.iterdir())) >= 3, f"{corpus}: few seeds"


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """Every target built once, into a temporary directory (make's BUILD)."""
    for fact in (missing_tool("make"), NO_LIBFUZZER):
        if fact.holds:
            host_skip(fact, "builds the fuzz targets")
    if missing_module("atheris").holds:
        host_skip(missing_module("atheris"), "runs the atheris targets")
    out = tmp_path_factory.mktemp("fuzz-build")
    p = subprocess.run(["make", "-s", "-C", str(FUZZ), f"BUILD={out}", f"PYTHON={sys.executable}",
                        f"-j{os.cpu_count() or 1}", "all", "atheris-asan"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-5000:]
    env = subprocess.run(["make", "-s", "-C", str(FUZZ), f"BUILD={out}",
                          f"PYTHON={sys.executable}", "asan-env"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return out, dict(line.split("=", 1) for line in env.split())


def command(build, target):
    """The target's command and environment: a libFuzzer binary, or atheris
    under the ASan build (python -S: see the Makefile's asan-env)."""
    out, asan_env = build
    if target in C_TARGETS:
        return [str(out / target)], dict(os.environ)
    return [sys.executable, "-S", str(FUZZ / f"{target}.py")], {**os.environ, **asan_env}


def run_forked(cmd, **kwargs):
    """subprocess.run(cmd), the child started by fork(), never vfork():
    libFuzzer's -rss_limit_mb reads the process's peak RSS (getrusage's
    ru_maxrss), which execve() carries over from the memory it replaces;
    after vfork() that is the pytest worker's, whose peak is whatever its
    largest test mapped (4 GiB in tests/robustness/test_load.py), and a
    target reported an "oom" on its first input. After fork() it starts
    from the worker's present RSS."""
    # The switches Python's docs give for this: posix_spawn() (which it uses
    # for some arguments) vforks too.
    saved = subprocess._USE_VFORK, subprocess._USE_POSIX_SPAWN
    subprocess._USE_VFORK = subprocess._USE_POSIX_SPAWN = False
    try:
        return subprocess.run(cmd, **kwargs)
    finally:
        subprocess._USE_VFORK, subprocess._USE_POSIX_SPAWN = saved


def run(build, target, args, cwd):
    cmd, env = command(build, target)
    env["TMPDIR"] = str(cwd)  # what a target makes (a socket, files) goes there
    return run_forked(cmd + ["-timeout=30", "-rss_limit_mb=2048", *args], cwd=cwd, env=env,
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                      timeout=SECONDS + 300)


def vm_rss_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_a_target_does_not_start_with_the_workers_peak_rss():
    """After this process has held 1 GiB more than it holds now, a child's
    peak RSS is at most what fork() copies of it (its present RSS), and far
    below the peak."""
    held = mmap.mmap(-1, 1 << 30)
    for offset in range(0, len(held), mmap.PAGESIZE):
        held[offset] = 1
    held.close()
    present = vm_rss_kib()
    code = "import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    p = run_forked([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                   check=True)
    assert int(p.stdout) < present + (256 << 10), \
        f"the child's peak RSS: {p.stdout.strip()} KiB; this process holds {present} KiB"


@pytest.mark.parametrize("target", C_TARGETS + PY_TARGETS)
def test_every_committed_input_passes(build, target, tmp_path):
    inputs = sorted(str(p) for p in (FUZZ / "corpus" / target).iterdir())
    p = run(build, target, inputs, tmp_path)
    assert p.returncode == 0, f"{target} fails on a committed input:\n{p.stdout[-20000:]}"
    ran = re.findall(r"^Executed (\S+) in", p.stdout, re.M)
    assert sorted(ran) == inputs, p.stdout[-5000:]


@pytest.mark.slow  # the build first, then each target for seconds
@pytest.mark.parametrize("target", C_TARGETS + PY_TARGETS)
def test_fuzzing_finds_nothing(build, target, tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(FUZZ / "corpus" / target, corpus)
    p = run(build, target, [f"-max_total_time={SECONDS}", str(corpus)], tmp_path)
    found = sorted(f.name for f in tmp_path.iterdir() if f.name.split("-")[0] in
                   ("crash", "leak", "timeout", "oom"))
    assert p.returncode == 0 and not found, \
        f"{target} found {found} (in {tmp_path}):\n{p.stdout[-20000:]}"
    runs = re.search(r"^Done (\d+) runs in", p.stdout, re.M)
    assert runs and int(runs.group(1)) > 0, p.stdout[-5000:]
