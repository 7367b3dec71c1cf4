"""A snapshot file changed under a running experiment (truncated, shrunk,
replaced, removed, rewritten in place), under both source_read modes: the
run fails with a RunError naming the file, or its verification says the
source changed; the interpreter never dies of it (SIGBUS from a mapping of
a file cut short), and a SIGBUS that is not the guard's still reaches
faulthandler.

Each run that could kill its process runs in a child, so that a SIGBUS
fails one test rather than ending the suite. The change is made from the
run's progress callback once every vCPU has touched 64 pages, while the
run is paging (1 ms a fault, 2,048 faults)."""
from __future__ import annotations

import json
import signal
import subprocess
import textwrap

import pytest
from helpers.children import ENV as CHILD_ENV
from helpers.children import python

pytestmark = pytest.mark.kvm

PAGE = 4096
VCPUS = 2
MEM = 4 << 20
REGION = VCPUS * MEM
EARLY = 16 * PAGE                 # fetched before the change: each slice's first pages

CHILD = textwrap.dedent("""
    import faulthandler, json, mmap, os, sys
    import uffdkvm

    path, read, change, fields = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    if "faulthandler" in change:
        faulthandler.enable()

    def crash():
        # A real SIGBUS, in no copy of the run's: a mapping of a file cut short.
        with open(path + ".other", "wb+") as f:
            f.truncate(2 * {page})
            m = mmap.mmap(f.fileno(), 2 * {page})
            f.truncate(0)
            print("touching", flush=True)
            m[{page}]

    def change_it():
        if change == "truncate":
            os.truncate(path, 0)
        elif change == "shrink":
            os.truncate(path, os.path.getsize(path) // 2)
        elif change == "shrink-end":  # the last quarter: far from where the vCPUs are
            os.truncate(path, os.path.getsize(path) // 4 * 3)
        elif change == "replace":
            uffdkvm.make_snapshot(path + ".new", {region}, seed=6)
            os.replace(path + ".new", path)
        elif change == "remove":
            os.unlink(path)
        elif change == "rewrite":
            with open(path, "r+b") as f:
                for start in range(0, {region}, {mem}):
                    f.seek(start)
                    f.write(os.urandom({early}))
        elif change.startswith("crash"):
            crash()

    done = []
    def progress(p):
        if not done and p.phase == "running" and (sum(p.pages_done) >= 128 or
                                                   change.startswith("crash")):
            done.append(1)
            change_it()

    uffdkvm.make_snapshot(path, {region}, seed=5)
    try:
        r = uffdkvm.run(**{{"vcpus": {vcpus}, "mem_per_vcpu": {mem}, "source": "file",
                        "source_path": path, "source_read": read, "delay_us": 1000,
                        "progress": progress, **fields}})
        print("RESULT ok", "verified" if r.verified else "unverified", r.verify_message)
    except uffdkvm.UffdkvmError as e:
        print("RESULT", type(e).__name__, e)
    assert done, "the run ended before the change"
    print("process alive")
    if change.startswith("after"):
        crash()
""").format(region=REGION, vcpus=VCPUS, mem=MEM, page=PAGE, early=EARLY)


def child(tmp_path, read, change, **fields):
    return subprocess.run(python(tmp_path / "snap.img", read, change, json.dumps(fields),
                                 code=CHILD),
                          env=CHILD_ENV, capture_output=True, text=True, timeout=60)


def outcome(tmp_path, read, change, **fields):
    """The child's outcome line (after "RESULT "), failing on its death."""
    proc = child(tmp_path, read, change, **fields)
    if proc.returncode < 0:
        pytest.fail(f"the run killed its process with "
                    f"{signal.Signals(-proc.returncode).name}: {proc.stderr[-2000:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "process alive" in proc.stdout, proc.stdout
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return lines[0][len("RESULT "):]


READS = pytest.mark.parametrize("read", ["mmap", "pread"])


@pytest.mark.parametrize("change", ["truncate", "shrink"])
@READS
def test_a_file_cut_short_during_the_run_fails_it_and_the_process_lives(kvm, tmp_path, read,
                                                                      change):
    """Red before the guard: source_read="mmap" died of SIGBUS. Both modes now
    say the same: the fetch found the file's end."""
    said = outcome(tmp_path, read, change)
    assert said.startswith("RunError "), said
    assert f"source_path {tmp_path / 'snap.img'}" in said, said
    assert "the file ended early: was it truncated during the run?" in said, said


@pytest.mark.parametrize("who,change,fields", [
    ("vCPU ", "truncate", dict(resolver="vcpu")),
    # The pusher installs from the region's end, where the file is cut, the vCPUs
    # from its start: the pusher is the first to find the file's end.
    ("prefetch pusher", "shrink-end", dict(prefetch="replay", prefetch_bandwidth_mbps=8,
                                           replay_from=list(range(REGION // PAGE - 1, -1, -1)))),
    ("reader ", "truncate", dict(prefetch="readahead", prefetch_pages=4, delay_us=5000)),
])
def test_every_thread_that_copies_from_the_mapping_is_guarded(kvm, tmp_path, who, change,
                                                              fields):
    """vCPUs resolving their own faults, the pusher, readahead: each fetch
    from a file cut short is the run's error, not a SIGBUS."""
    said = outcome(tmp_path, "mmap", change, **fields)
    assert said.startswith("RunError "), said
    assert "the file ended early: was it truncated during the run?" in said, said
    assert who in said, said


def test_a_file_cut_short_under_a_page_server_fails_the_run(kvm, tmp_path):
    """source="remote": the server process sends from its own mapping, which
    the kernel refuses (EFAULT) past the file's new end; the server drops the
    connection and the run fails, the process alive."""
    said = outcome(tmp_path, "pread", "truncate", source="remote")
    assert said.startswith("RunError "), said
    assert "of the page server at" in said, said


@pytest.mark.parametrize("change,how", [("replace", "was replaced"), ("remove", "was removed")])
@READS
def test_a_file_replaced_or_removed_during_the_run_is_a_run_error(kvm, tmp_path, read, change,
                                                                  how):
    """The open file keeps the old inode, so the run reads one file
    throughout; but the path no longer names it, and the result would."""
    said = outcome(tmp_path, read, change)
    assert said.startswith("RunError "), said
    assert f"source_path {tmp_path / 'snap.img'} {how} during the run" in said, said


@READS
def test_bytes_rewritten_in_place_fail_verification_saying_the_source_changed(kvm, tmp_path,
                                                                            read):
    said = outcome(tmp_path, read, "rewrite")
    assert said.startswith("ok unverified "), said
    assert "the source changed during the run" in said, said
    assert "the source file's bytes" in said, said   # and the page that shows it


# A crash during a run makes it at the first report: the run would go on for
# hours (5 s a fault), holding the guard, so a handler that failed to pass
# the crash on would leave the child looping in it until the timeout, rather
# than dying once the run ended and put the old handler back.
SLOW = dict(delay_us=5_000_000)


@pytest.mark.parametrize("when", ["during", "after"])
def test_a_sigbus_that_is_not_the_guards_still_reaches_faulthandler(kvm, tmp_path, when):
    """A crash of the process's own (Python's mmap of a file cut short),
    while a run holds the guard or after: faulthandler reports it and the
    process dies of SIGBUS, as without uffdkvm."""
    proc = child(tmp_path, "mmap", f"{'crash' if when == 'during' else 'after'}-faulthandler",
                 **(SLOW if when == "during" else {}))
    assert "touching" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stderr[-2000:])
    assert "Fatal Python error: Bus error" in proc.stderr, proc.stderr[-2000:]


def test_a_sigbus_with_no_handler_before_kills_as_it_would_have(kvm, tmp_path):
    """No faulthandler: the guard's handler hands the fault to the default
    action (kill), rather than retrying it forever or swallowing it."""
    proc = child(tmp_path, "mmap", "crash", **SLOW)
    assert "touching" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stderr[-2000:])
    assert "Fatal Python error" not in proc.stderr


RUNS = textwrap.dedent("""
    import faulthandler, signal, sys
    import uffdkvm

    path = sys.argv[1]
    seen = []
    signal.signal(signal.SIGBUS, lambda sig, frame: seen.append(sig))  # before the first run
    uffdkvm.make_snapshot(path, 1 << 20, seed=5)

    put = []
    def progress(p):
        if p.phase == "running" and len(put) == run:
            put.append(run)
            signal.raise_signal(signal.SIGBUS)    # in no copy: sent to this thread
            # faulthandler over the guard's, chaining to it, for the next run to
            # find. It put itself out at the SIGBUS but still says it is enabled.
            faulthandler.disable()
            faulthandler.enable()

    for run in range(3):
        uffdkvm.run(vcpus=1, mem_per_vcpu=1 << 20, source="file", source_path=path,
                    source_read="mmap", delay_us=1000, progress=progress)
        assert len(put) == run + 1, "no progress report while running"
        print("run", run, "the handler before saw", len(seen), flush=True)
""")


def test_a_sigbus_outside_a_copy_reaches_the_handlers_before_and_after_over_runs(kvm, tmp_path):
    """A handler set before the first run (Python's), and faulthandler put
    over the guard's during each run (it chains to the one it replaced): a
    SIGBUS sent during each of three runs reaches the first, and
    faulthandler from the second run on, once each, and the process lives.
    Red when a later run installed the guard over faulthandler again: the
    guard handed the signal to faulthandler, faulthandler back to the
    guard, and so on without end."""
    proc = subprocess.run(python(tmp_path / "snap.img", code=RUNS), env=CHILD_ENV,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert proc.stdout.splitlines() == [f"run {i} the handler before saw {i + 1}"
                                        for i in range(3)], proc.stdout
    assert proc.stderr.count("Fatal Python error: Bus error") == 2, proc.stderr[-2000:]
