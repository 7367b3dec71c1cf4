"""A snapshot file changed under a running experiment (truncated, shrunk,
replaced, rewritten in place), under both source_read modes: the run fails
with a RunError naming the file, or says what changed; the interpreter
never dies of it (SIGBUS from a mapping of a file cut short).

Each run that could kill its process runs in a child, so that a SIGBUS
fails one test rather than ending the suite."""
from __future__ import annotations

import signal
import subprocess
import textwrap

import pytest
from children import ENV as CHILD_ENV
from children import python

pytestmark = pytest.mark.kvm

PAGE = 4096
VCPUS = 2
MEM = 4 << 20
REGION = VCPUS * MEM

# The child: a run whose faults each take 1 ms (2,048 of them, 2 s), and a
# thread that does CHANGE to the file 0.3 s in, while the run is paging.
CHILD = textwrap.dedent("""
    import os, sys, threading, time
    import uffdkvm

    path, read, change = sys.argv[1], sys.argv[2], sys.argv[3]

    def cut():
        time.sleep(0.3)
        if change == "truncate":
            os.truncate(path, 0)
        elif change == "shrink":
            os.truncate(path, os.path.getsize(path) // 2)

    uffdkvm.make_snapshot(path, {region}, seed=5)
    t = threading.Thread(target=cut)
    t.start()
    try:
        uffdkvm.run(vcpus={vcpus}, mem_per_vcpu={mem}, source="file", source_path=path,
                    source_read=read, delay_us=1000)
        print("RESULT ok")
    except uffdkvm.UffdkvmError as e:
        print("RESULT", type(e).__name__, e)
    finally:
        t.join()
""").format(region=REGION, vcpus=VCPUS, mem=MEM)


def child_run(tmp_path, read, change):
    """The child's outcome line (after "RESULT "), failing on its death."""
    proc = subprocess.run(python(tmp_path / "snap.img", read, change, code=CHILD),
                          env=CHILD_ENV, capture_output=True, text=True, timeout=120)
    if proc.returncode < 0:
        pytest.fail(f"the run killed its process with "
                    f"{signal.Signals(-proc.returncode).name}: {proc.stderr[-2000:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return lines[0][len("RESULT "):]


@pytest.mark.parametrize("change", ["truncate", "shrink"])
@pytest.mark.parametrize("read", ["mmap", "pread"])
def test_a_file_cut_short_during_the_run_fails_it_and_the_process_lives(kvm, tmp_path, read,
                                                                      change):
    path = tmp_path / "snap.img"
    outcome = child_run(tmp_path, read, change)
    assert outcome.startswith("RunError "), outcome
    assert f"source_path {path}" in outcome, outcome
    assert "truncated during the run" in outcome, outcome
