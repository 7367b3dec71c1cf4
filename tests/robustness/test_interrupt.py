"""Interruption: Ctrl-C, a time limit, other signals and other threads.

A run that is interrupted ends quickly (within a second of the signal or the
limit), gives back every thread and fd, and leaves the process able to run
the next experiment. While a run is in progress the GIL is free, so other
Python threads (and signal handlers) keep running.
"""
import json
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import uffdkvm
from helpers.children import ENV as CHILD_ENV
from helpers.children import python
from helpers.hostfacts import host_skip, mem_available_below, mem_info
from helpers.resources import assert_released
from helpers.runs import run_with_fault
from helpers.skips import needs_test_hooks

# alone (tests/helpers/machine_lock.py): Ctrl-C answered within a bound.
pytestmark = [pytest.mark.kvm, pytest.mark.alone]

# How long after a signal or the time limit the run may take to end. A vCPU
# waiting on a fault that a reader holds is woken by closing its uffd, which
# the core does 0.5 s into the stop; everything else ends at once.
PROMPT_S = 1.0

# Runs that would take far longer than any test: each is stopped early.
LONG_RUNS = {
    # a reader sleeps out a 10 s delay while holding the fault
    "delay-epoll_exclusive": dict(vcpus=2, mem_per_vcpu="1M", delay_us=10_000_000),
    # blocking read(2) readers, which need a signal to let go
    "delay-read": dict(vcpus=2, mem_per_vcpu="1M", delay_us=100_000, wait="read",
                       readers=2),
    # the herd: 8 readers polling one uffd
    "delay-poll": dict(vcpus=2, mem_per_vcpu="4M", delay_us=50_000, wait="poll",
                       readers=8, single_uffd=True),
    # 8 readers asleep in their io_urings, a read of one uffd in flight in each
    "delay-io_uring": dict(vcpus=2, mem_per_vcpu="4M", delay_us=50_000, wait="io_uring",
                           readers=8, single_uffd=True),
    # no userfaultfd at all: vCPUs in KVM_RUN, walking a large region forever
    "no-uffd-passes": dict(vcpus=2, mem_per_vcpu="64M", uffd_mode=None, passes=1_000_000),
    # MINOR faults on a 2 GiB memfd: the page cache prefill, then the faults
    "minor-large": dict(vcpus=1, mem_per_vcpu="2G", backing="shmem", uffd_mode="minor"),
}

CHILD = r"""
import json, os, sys, time, uffdkvm

def counts():
    return [len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))]

config = json.loads(sys.argv[1])
before = counts()
print(json.dumps({"started": time.monotonic()}), flush=True)
try:
    uffdkvm.run(**config)
    print(json.dumps({"finished": time.monotonic()}), flush=True)
except KeyboardInterrupt:
    at = time.monotonic()
    # The run may hand its last teardown (a large memfd's pages freed) to the
    # background after CANCEL_WAIT_NS, slow where the guest is emulated: wait
    # for it, bounded, and let the last joined threads leave /proc/self/task.
    uffdkvm._core.wait_idle(10.0)
    time.sleep(0.05)
    print(json.dumps({"interrupted": at, "before": before, "after": counts()}), flush=True)
r = uffdkvm.run(vcpus=2, mem_per_vcpu="1M", readers=2, wait=config.get("wait", "poll"))
print(json.dumps({"verified": r.verified, "faults": r.faults}), flush=True)
"""


@pytest.mark.parametrize("name", list(LONG_RUNS))
def test_ctrl_c_stops_a_run_promptly_and_the_process_runs_the_next(kvm, name):
    # The child runs from / with the package under test first on its path.
    child = subprocess.Popen(python(json.dumps(LONG_RUNS[name]), code=CHILD),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=CHILD_ENV)
    try:
        assert "started" in json.loads(child.stdout.readline())
        time.sleep(0.5)  # well into the run
        sent = time.monotonic()  # CLOCK_MONOTONIC: the same clock as the child's
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, err
    interrupted, second = [json.loads(line) for line in out.splitlines()]
    assert "interrupted" in interrupted, f"the run was not interrupted: {interrupted}"
    assert interrupted["interrupted"] - sent < PROMPT_S
    assert interrupted["after"] == interrupted["before"], "fds and threads are given back"
    assert second == {"verified": True, "faults": 512}


def interrupt_in(seconds, how=signal.raise_signal, signo=signal.SIGINT):
    """Sends signo to this process from a timer thread; returns the thread,
    whose .sent is when it did."""
    def fire():
        timer.sent = time.monotonic()
        how(signo)
    timer = threading.Timer(seconds, fire)
    timer.sent = None
    timer.start()
    return timer


def test_ctrl_c_in_process_raises_keyboard_interrupt_within_a_second(kvm, released):
    timer = interrupt_in(0.3)
    with pytest.raises(KeyboardInterrupt):
        uffdkvm.run(vcpus=2, mem_per_vcpu="1M", delay_us=10_000_000)
    assert time.monotonic() - timer.sent < PROMPT_S
    timer.join()
    assert_released(released)
    r = uffdkvm.run(vcpus=2, mem_per_vcpu="1M")
    assert r.verified and r.faults == 512


def test_a_signal_handler_that_does_not_raise_runs_and_the_run_goes_on(kvm, released):
    """The binding checks for signals every 50 ms: Python handlers run during
    run(), and one that returns normally does not disturb the experiment."""
    calls = []
    old = signal.signal(signal.SIGUSR1, lambda signo, frame: calls.append(time.monotonic()))
    try:
        timer = interrupt_in(0.1, signo=signal.SIGUSR1)
        r = uffdkvm.run(vcpus=1, mem_per_vcpu="256K", delay_us=5000)  # about 0.3 s
        ended = time.monotonic()
        timer.join()
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert r.verified and r.faults == 64
    assert len(calls) == 1
    assert calls[0] - timer.sent < 0.25, "the handler ran while run() was in progress"
    assert calls[0] < ended


def test_an_exception_from_any_signal_handler_stops_the_run(kvm, released):
    """A handler may raise what it likes (an alarm-based time limit, say):
    run() stops, cleans up, and lets that exception through."""
    class Alarm(Exception):
        pass

    def on_alarm(signo, frame):
        raise Alarm()

    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        start = time.monotonic()
        with pytest.raises(Alarm):
            uffdkvm.run(vcpus=2, mem_per_vcpu="1M", delay_us=10_000_000)
        assert time.monotonic() - start < 0.3 + PROMPT_S
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert_released(released)


WAITS = ["poll", "epoll", "epoll_exclusive", "read"]


@pytest.mark.parametrize("wait", [*WAITS, "io_uring", "spin_idle"])
def test_timeout_ends_a_run_whose_fault_is_never_resolved(kvm, released, wait):
    """A reader that dies holding a fault leaves a vCPU waiting forever;
    timeout_s ends the run, stops every reader (blocking ones too, and
    spinners at SCHED_IDLE), and the next run works."""
    limit = 0.3
    start = time.monotonic()
    pins = dict(pin_vcpus=(min(os.sched_getaffinity(0)),)) if wait == "spin_idle" else {}
    with pytest.raises(uffdkvm.RunTimeoutError) as info:
        run_with_fault(vcpus=1, mem_per_vcpu="1M", readers=2, wait=wait,
                       fault="reader_exit", after=3, timeout_s=limit, **pins)
    elapsed = time.monotonic() - start
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, uffdkvm.RunError)
    assert limit <= elapsed < limit + PROMPT_S
    assert str(info.value).startswith("the run did not finish within timeout_s=0.300: "
                                      "1 of 1 vCPUs were still running")
    assert_released(released)
    r = uffdkvm.run(vcpus=1, mem_per_vcpu="1M", readers=2, wait=wait, **pins)
    assert r.verified and r.faults == 256


def test_timeout_while_a_reader_sleeps_out_a_long_delay(kvm, released):
    start = time.monotonic()
    with pytest.raises(uffdkvm.RunTimeoutError):
        uffdkvm.run(vcpus=2, mem_per_vcpu="1M", delay_us=10_000_000, timeout_s=0.3)
    assert time.monotonic() - start < 0.3 + PROMPT_S


def test_the_gil_is_free_while_a_run_is_in_progress(kvm):
    """Another Python thread keeps running during run(): a sampler wakes up
    twice while the run is in progress and sees a counting thread advance."""
    count, stop, samples = [0], threading.Event(), []

    def counter():
        while not stop.is_set():
            count[0] += 1

    def sample():
        samples.append((time.monotonic(), count[0]))

    threads = [threading.Thread(target=counter), threading.Timer(0.1, sample),
               threading.Timer(0.2, sample)]
    for t in threads:
        t.start()
    try:
        r = uffdkvm.run(vcpus=1, mem_per_vcpu="256K", delay_us=5000)  # about 0.3 s
        returned = time.monotonic()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert r.verified
    (t1, n1), (t2, n2) = samples
    assert t2 < returned, "both samples were taken while run() was in progress"
    assert n2 - n1 > 1000, f"the counting thread advanced {n2 - n1} times in 0.1 s"


def test_a_run_from_a_thread_other_than_main(kvm, released):
    results, errors = [], []

    def work():
        try:
            results.append(uffdkvm.run(vcpus=2, mem_per_vcpu="1M", readers=2, wait="read"))
        except BaseException as e:  # reported below
            errors.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join(30)
    assert not t.is_alive() and not errors, errors
    assert results[0].verified and results[0].faults == 512


def test_runs_in_several_threads_at_once_each_verify_or_fail_alone(kvm, released):
    """Experiments are independent: four at once, one failing, one timing
    out, and the others verify."""
    needs_test_hooks("two of the runs fail by injection")
    with ThreadPoolExecutor(4) as pool:
        good = [pool.submit(uffdkvm.run, vcpus=2, mem_per_vcpu="2M", readers=2, wait=w,
                            seed=i) for i, w in enumerate(WAITS)]
        failing = pool.submit(run_with_fault, vcpus=2, mem_per_vcpu="2M",
                              fault="resolve_eio", after=5)
        stuck = pool.submit(run_with_fault, vcpus=2, mem_per_vcpu="2M", readers=2,
                            fault="reader_exit", after=5, timeout_s=0.3)
        for f in good:
            r = f.result()
            assert r.verified and r.faults == 1024
        with pytest.raises(uffdkvm.RunError, match="UFFDIO_COPY"):
            failing.result()
        with pytest.raises(uffdkvm.RunTimeoutError):
            stuck.result()


def test_timeout_covers_the_setup_before_the_vcpus_start(kvm, released):
    if (mem_info("MemAvailable") or 0) < 4 << 30:
        host_skip(mem_available_below(4 << 30), "needs 4 GiB of available memory")
    limit = 0.05
    start = time.monotonic()
    with pytest.raises(uffdkvm.RunTimeoutError):
        uffdkvm.run(vcpus=1, mem_per_vcpu="2G", backing="shmem", uffd_mode="minor",
                    timeout_s=limit)
    assert time.monotonic() - start < limit + 0.5


# Signals a thread raises by itself, at the instruction that faulted (or by
# abort()): blocked, they kill the process without running any handler, so
# faulthandler could not print where a core thread crashed.
SYNCHRONOUS = {"SIGSEGV": signal.SIGSEGV, "SIGBUS": signal.SIGBUS, "SIGILL": signal.SIGILL,
               "SIGFPE": signal.SIGFPE, "SIGTRAP": signal.SIGTRAP, "SIGSYS": signal.SIGSYS,
               "SIGABRT": signal.SIGABRT}


def blocked_signals(tid):
    """(name, SigBlk mask) of one of this process's threads, or None if it ended."""
    try:
        with open(f"/proc/self/task/{tid}/status") as f:
            status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return None
    return status["Name"], int(status["SigBlk"], 16)


def test_core_threads_block_process_signals_but_not_synchronous_ones(kvm, released):
    """Every thread the core makes (controller, vCPUs, readers) blocks SIGINT,
    so that Ctrl-C reaches Python's main thread, and leaves the synchronous
    signals unblocked, so that a crash in one reaches faulthandler."""
    before = set(os.listdir("/proc/self/task"))
    masks, sampler = {}, {}

    def sample():
        sampler["tid"] = str(threading.get_native_id())
        time.sleep(0.3)  # well into the run: every thread is up
        for tid in set(os.listdir("/proc/self/task")) - before:
            masks[tid] = blocked_signals(tid)

    thread = threading.Thread(target=sample)
    thread.start()
    # 2 uffds x 2 readers, 512 faults at 5 ms each: some 0.6 s.
    r = uffdkvm.run(vcpus=2, mem_per_vcpu="1M", readers=2, delay_us=5000)
    thread.join()
    assert r.verified
    masks.pop(sampler["tid"], None)
    # KVM's own workers (kvm-nx-lpage-recovery, a user worker of this
    # process since Linux 6.13) are not the core's.
    masks = {tid: sample[1] for tid, sample in masks.items()
             if sample is not None and not sample[0].startswith("kvm-")}
    assert len(masks) >= 1 + 2 + 4, f"sampled {len(masks)} core threads"
    for tid, mask in masks.items():
        assert mask & (1 << (signal.SIGINT - 1)), f"thread {tid} lets SIGINT in: {mask:#x}"
        unblocked = [name for name, signo in SYNCHRONOUS.items() if not mask & (1 << (signo - 1))]
        assert unblocked == list(SYNCHRONOUS), \
            f"thread {tid} blocks {set(SYNCHRONOUS) - set(unblocked)} (SigBlk {mask:#x})"


# ---- Ctrl-C while a thread will not stop ----

STALL_MS = 3000


@pytest.mark.parametrize("when", ["running", "stopping"])
def test_ctrl_c_answers_while_a_thread_will_not_stop(kvm, released, when):
    """SIGINT raises KeyboardInterrupt within PROMPT_S even when a reader
    will not stop: while the run still runs (delays keep it going), or once
    it ended and the core is waiting for the stalled reader. Once the reader
    leaves, everything is given back."""
    # Before the timer: a skip after it would leave its SIGINT to a later test.
    needs_test_hooks("a reader stalls by injection")
    slow = dict(delay_us=10_000) if when == "running" else {}
    timer = interrupt_in(0.3 if when == "running" else 0.8)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_with_fault(vcpus=2, mem_per_vcpu="1M", readers=2, fault="reader_stall",
                       after=STALL_MS, **slow)
    answered = time.monotonic()
    timer.join()
    assert answered - timer.sent < PROMPT_S
    assert answered - start < STALL_MS / 1000, "Ctrl-C waited for the stalled reader"
    assert_released(released, within_s=10)  # waits for the reader (wait_idle) first


CRASH_CHILD = """
import faulthandler, sys, uffdkvm
from uffdkvm.testing._faults import run_with_fault
faulthandler.enable()
print("running", flush=True)
run_with_fault(vcpus=1, mem_per_vcpu="1M", readers=2, fault="reader_crash")
print("survived", flush=True)
"""


def test_a_crash_in_a_core_thread_reaches_faulthandler(kvm):
    """A reader that segfaults kills the process, but SIGSEGV is not blocked
    in core threads: faulthandler's handler runs first and says so. (Were
    it blocked, the kernel would kill the process silently.)"""
    needs_test_hooks("makes a reader crash")
    p = subprocess.run(python(code=CRASH_CHILD), capture_output=True, text=True,
                       timeout=60, env=CHILD_ENV)
    assert p.stdout.splitlines() == ["running"], p.stdout
    assert p.returncode == -signal.SIGSEGV, (p.returncode, p.stderr)
    assert "Fatal Python error: Segmentation fault" in p.stderr, p.stderr
