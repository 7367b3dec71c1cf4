"""Where the threads run: pin_vcpus and pin_readers (a CPU list, or "vcpus":
each reader on the CPU of the vCPU it serves), and unpinned threads.

Every test reads where the threads ran from the threads themselves (each
records the CPUs it could run on) and, for the runs in this process, from
the kernel (each thread's Cpus_allowed_list in /proc, read while it runs),
so forcing the placement away in the mapping to the core (run.py hands the
core an empty reader pin list) turns them red.
"""
from __future__ import annotations

import os
import threading
import time

import pytest

import uffdkvm
from uffdkvm import Config, ConfigError, HostUnsupportedError
from helpers.children import ENV as CHILD_ENV
from helpers.children import uffdkvm_command
from helpers.evidence import CpuSampler, Trace
from helpers.hostfacts import cpus_unavailable, fewer_cpus_than, host_skip
from helpers.runs import small

CPUS = sorted(os.sched_getaffinity(0))


def _cpu_list(text):
    """ "0-2,5" as {0, 1, 2, 5}."""
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cpus)


def run_watching_affinity(**fields):
    """Runs an experiment that must verify, while another thread reads
    every thread's Cpus_allowed_list from /proc/self/task/TID/status: the
    kernel's own record of where each may run, independent of what the
    threads report of themselves. Returns (result, {tid: CPUs}), each
    thread's last reading (after it pinned itself: it pins as it starts)."""
    seen, done = {}, threading.Event()

    def watch():
        while not done.is_set():
            for tid in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{tid}/status") as f:
                        for line in f:
                            if line.startswith("Cpus_allowed_list:"):
                                seen[int(tid)] = _cpu_list(line.split(":")[1].strip())
                except OSError:
                    pass  # the thread left
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        r = uffdkvm.run(**fields)
    finally:
        done.set()
        watcher.join()
    assert r.verified, r.verify_message
    return r, seen


@pytest.fixture
def two_cpus(kvm) -> None:
    """KVM, and two CPUs this process may use; else a skip citing the fact."""
    if fewer_cpus_than(2).holds:
        host_skip(fewer_cpus_than(2), "needs two CPUs to place threads apart")


# Slow enough (1 ms a fault, 256 a vCPU) that the watcher reads every thread
# while it runs. (Two spin_idle readers on one CPU, one of them sleeping
# through the delay, take about a tick a fault here, 3.7 ms against 0.33
# with one reader: both run at SCHED_IDLE, which would leave the woken
# sleeper behind the spinner's slice. At 4 MiB the run took 7 s.)
WATCHED = dict(mem_per_vcpu="1M", delay_us=1000)


def test_per_vcpu_uffds_put_each_reader_with_its_vcpu(two_cpus) -> None:
    pins = (CPUS[1], CPUS[0])  # crossed, so that reader k on CPU k would be wrong
    r, kernel = run_watching_affinity(vcpus=2, readers=2, pin_vcpus=pins,
                                      pin_readers="vcpus", **WATCHED)
    for reader in r.readers:
        # uffd u holds vCPU u's memory alone
        assert reader.cpus == (pins[reader.uffd],), reader
        assert kernel[reader.tid] == {pins[reader.uffd]}, reader
    for i, vcpu in enumerate(r.vcpus):
        assert vcpu.cpus == (pins[i],)
        assert kernel[vcpu.tid] == {pins[i]}
        assert vcpu.faults > 0


def test_one_uffd_spreads_its_readers_over_the_vcpus_cpus(two_cpus) -> None:
    pins = (CPUS[0], CPUS[1])
    r, kernel = run_watching_affinity(vcpus=2, readers=3, single_uffd=True,
                                      pin_vcpus=pins, pin_readers="vcpus", **WATCHED)
    want = [(pins[0],), (pins[1],), (pins[0],)]
    assert [reader.cpus for reader in r.readers] == want
    assert [tuple(sorted(kernel[reader.tid])) for reader in r.readers] == want


def test_reader_cpus_spells_the_placement_out() -> None:
    c = Config(vcpus=3, readers=2, pin_vcpus="0,1", pin_readers="vcpus")
    assert c.reader_cpus == (0, 0, 1, 1, 0, 0)
    assert Config(vcpus=3, readers=2, single_uffd=True, pin_vcpus="0,1",
                  pin_readers="VCPUS").reader_cpus == (0, 1)
    # More pins than vCPUs: only the CPUs the vCPUs get carry readers.
    assert Config(vcpus=1, readers=2, single_uffd=True, pin_vcpus="0,1",
                  pin_readers="vcpus").reader_cpus == (0, 0)
    assert Config(pin_readers="1,0").reader_cpus == (1, 0)
    assert Config().reader_cpus is None


def test_readers_go_with_pinned_vcpus_by_default(two_cpus) -> None:
    """No pin_readers, vCPUs pinned: each reader on its vCPU's CPU, as
    pin_readers="vcpus" would put it, in the readers' own record and the
    kernel's. A default silently back at the scheduler's placement leaves
    every reader every CPU, and fails here."""
    pins = (CPUS[1], CPUS[0])  # crossed, so that reader k on CPU k would be wrong
    r, kernel = run_watching_affinity(vcpus=2, readers=2, pin_vcpus=pins, **WATCHED)
    assert r.config.pin_readers is None
    for reader in r.readers:
        assert reader.cpus == (pins[reader.uffd],), reader
        assert kernel[reader.tid] == {pins[reader.uffd]}, reader


def test_the_default_placement_spelled_out() -> None:
    """What pin_readers=None means, field by field: with the vCPUs' CPUs when
    they are pinned and the readers sleep; the scheduler's otherwise."""
    assert Config(vcpus=2, readers=2, pin_vcpus="1,0").reader_cpus == (1, 1, 0, 0)
    assert Config(vcpus=2, readers=2, pin_vcpus="1,0").readers_with_vcpus
    assert Config(vcpus=2, readers=3, single_uffd=True,
                  pin_vcpus="0,1").reader_cpus == (0, 1, 0)
    assert Config(vcpus=2, readers=2).reader_cpus is None            # vCPUs unpinned
    assert Config(vcpus=2, pin_vcpus="0,1", wait="spin").reader_cpus is None
    assert Config(vcpus=2, pin_vcpus="0,1", resolver="vcpu").reader_cpus is None
    assert Config(vcpus=2, pin_vcpus="0,1", uffd_mode=None).reader_cpus is None
    for wait in ("poll", "epoll", "read", "io_uring"):
        assert Config(vcpus=2, pin_vcpus="0,1", wait=wait).reader_cpus == (0, 1)


def test_scheduler_keeps_upstreams_placement() -> None:
    c = Config(vcpus=2, readers=2, pin_vcpus="0,1", pin_readers="Scheduler")
    assert c.pin_readers == "scheduler"
    assert c.reader_cpus is None and not c.readers_with_vcpus
    assert Config(**c.to_dict()) == c
    assert Config(pin_readers="scheduler").reader_cpus is None


def test_scheduler_placement_leaves_the_readers_every_cpu(two_cpus) -> None:
    allowed = frozenset(os.sched_getaffinity(0))
    pins = (CPUS[1], CPUS[0])
    r, kernel = run_watching_affinity(vcpus=2, readers=2, pin_vcpus=pins,
                                      pin_readers="scheduler", **WATCHED)
    for reader in r.readers:
        assert reader.cpus == tuple(sorted(allowed)), reader
        assert kernel[reader.tid] == allowed, reader


def test_cli_default_and_scheduler(two_cpus) -> None:
    """-c alone puts the readers with their vCPUs; --pin-readers scheduler
    and -c's main-thread entry leave them unpinned (the main thread's CPU is
    what they inherit, as upstream's readers do)."""
    import subprocess

    def readers_cpus(*args: str) -> list[tuple[int, ...]]:
        p = subprocess.run(uffdkvm_command("-q", "-v", "2", "-b", "4M", *args, "--json"),
                           capture_output=True, text=True, env=CHILD_ENV)
        assert p.returncode == 0, p.stderr
        return [x.cpus for x in uffdkvm.Result.from_json(p.stdout).readers]

    crossed = f"{CPUS[1]},{CPUS[0]}"
    assert readers_cpus("-c", crossed) == [(CPUS[1],), (CPUS[0],)]
    everything = tuple(CPUS)
    assert readers_cpus("-c", crossed, "--pin-readers", "scheduler") == [everything] * 2
    # The main thread's entry: the readers inherit that one CPU.
    assert readers_cpus("-c", f"{crossed},{CPUS[0]}") == [(CPUS[0],)] * 2


def test_vcpus_placement_needs_vcpu_pins() -> None:
    with pytest.raises(ConfigError, match="pin_vcpus") as e:
        Config(vcpus=2, pin_readers="vcpus")
    assert e.value.field == "pin_readers"


def test_spinners_with_their_vcpus_are_refused(two_cpus) -> None:
    with pytest.raises(HostUnsupportedError, match="pin_readers"):
        uffdkvm.run(vcpus=1, mem_per_vcpu="4M", wait="spin", pin_vcpus=(CPUS[0],),
                    pin_readers="vcpus")


def test_the_placement_survives_json() -> None:
    c = Config(vcpus=2, pin_vcpus="0,1", pin_readers="vcpus")
    assert Config(**c.to_dict()) == c
    assert c.to_dict()["pin_readers"] == "vcpus"


def test_cli_takes_vcpus(two_cpus) -> None:
    import subprocess
    p = subprocess.run(uffdkvm_command("-q", "-v", "2", "-b", "4M",
                                       "-c", f"{CPUS[1]},{CPUS[0]}", "--pin-readers", "vcpus",
                                       "--json"),
                       capture_output=True, text=True, env=CHILD_ENV)
    assert p.returncode == 0, p.stderr
    r = uffdkvm.Result.from_json(p.stdout)
    # Where the readers ran (not the config echoed back) shows that the CLI
    # handed --pin-readers vcpus on.
    assert [reader.cpus for reader in r.readers] == [(CPUS[1],), (CPUS[0],)]


def test_threads_run_where_they_were_pinned(kvm):
    cpus = sorted(os.sched_getaffinity(0))
    vcpu_pins, reader_pins = cpus[::-1], cpus
    r, kernel = run_watching_affinity(vcpus=3, readers=2, pin_vcpus=vcpu_pins,
                                      pin_readers=reader_pins, mem_per_vcpu="4M", delay_us=300)
    # Each thread reports the affinity it saw from inside itself, and the
    # kernel says the same of it.
    for v in r.vcpus:
        assert v.cpus == (vcpu_pins[v.index % len(vcpu_pins)],)
        assert kernel[v.tid] == set(v.cpus)
    for k, x in enumerate(sorted(r.readers, key=lambda x: (x.uffd, x.index))):
        assert x.cpus == (reader_pins[k % len(reader_pins)],)
        assert kernel[x.tid] == set(x.cpus)


def test_unpinned_threads_may_run_anywhere_beside_pinned_ones(kvm):
    """vCPUs pinned, readers left to the scheduler (pin_readers="scheduler",
    upstream's placement) in one run: the readers keep every CPU the
    process may use (in the kernel's record too), while the vCPUs have their
    one. A run that pinned nothing, or everything, fails this."""
    allowed = frozenset(os.sched_getaffinity(0))
    if fewer_cpus_than(2).holds:
        host_skip(fewer_cpus_than(2), "needs two CPUs to tell pinned from unpinned")
    pin = min(allowed)
    r, kernel = run_watching_affinity(vcpus=2, readers=1, pin_vcpus=[pin], mem_per_vcpu="4M",
                                      delay_us=300, pin_readers="scheduler")
    for v in r.vcpus:
        assert v.cpus == (pin,)
        assert kernel[v.tid] == {pin}
    for x in r.readers:
        assert x.cpus == tuple(sorted(allowed))
        assert kernel[x.tid] == allowed


def test_pinning_to_a_cpu_the_process_cannot_use_is_a_host_error(kvm):
    with pytest.raises(uffdkvm.HostUnsupportedError, match="^pin_vcpus: CPU 1000 "):
        uffdkvm.run(mem_per_vcpu="1M", pin_vcpus=[1000])


def sampled_run(**fields):
    """A run of about half a second, CPU-bound in the guest and faulting all
    along, with the CPU of every thread sampled from /proc throughout."""
    with CpuSampler() as sampler:
        r = small(vcpus=2, mem_per_vcpu="1M", readers=1, guest_work=150,
                  trace_faults=True, **fields)
    return r, sampler


def seen_on(r, sampler):
    """{("vcpu"|"reader", index): Counter of CPUs} for the samples each
    thread surely took after pinning itself: a vCPU pins before the start
    barrier, so after the first fault of the run; a reader after it has
    read its first fault (before, it may not have run yet, and a thread
    that has never run shows the CPU it was created on)."""
    t = Trace(r.fault_trace)
    out = {("vcpu", v.index): sampler.cpus_of(v.tid, after_ns=int(t.read_ns.min()))
           for v in r.vcpus}
    for x in r.readers:
        mine = (t.uffd == x.uffd) & (t.reader == x.index)
        out[("reader", x.uffd)] = sampler.cpus_of(x.tid, after_ns=int(t.read_ns[mine].min()))
    for who, cpus in out.items():
        assert sum(cpus.values()) >= 20, f"{who} was hardly sampled: {cpus}"
    return out


# alone (tests/helpers/machine_lock.py): it samples where each thread ran for a
# fixed time, and needs 20 samples of each. The others read each thread's
# Cpus_allowed_list, which other tests' threads beside them cannot change.
@pytest.mark.alone
def test_pinned_threads_ran_only_where_they_were_pinned(kvm):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        host_skip(cpus_unavailable(0, 1), "needs two CPUs to tell pinned from unpinned")
    a, b = cpus[:2]
    # Both vCPUs crammed onto one CPU, the readers onto the other: the kernel
    # ran each thread nowhere else, in either arrangement. The two
    # arrangements are each other's control: with the pins ignored (or a
    # sampler that saw one CPU whatever happened) a thread cannot be seen
    # only on a in one and only on b in the other. (An unpinned control run
    # used to come first and skipped, unexplained, whenever a busy host's
    # scheduler kept both vCPUs on one CPU.)
    for vcpu_cpu, reader_cpu in ((a, b), (b, a)):
        seen = seen_on(*sampled_run(pin_vcpus=[vcpu_cpu], pin_readers=[reader_cpu]))
        for (kind, index), cpus_seen in seen.items():
            want = vcpu_cpu if kind == "vcpu" else reader_cpu
            assert set(cpus_seen) == {want}, f"{kind} {index} pinned to {want}: {cpus_seen}"


# ---- pin_readers' words obey the reader fields' rules (issue 21, review item 5)

APPLIES_MESSAGE = ("pin_readers: applies to resolver='readers' only, not resolver='vcpu'; "
                   "set resolver='readers' or leave pin_readers at its default (None)")


@pytest.mark.parametrize("pins", ["scheduler", "Scheduler", "vcpus", "0", [0, 1]])
def test_every_form_of_pin_readers_applies_to_readers_only(pins) -> None:
    """resolver="vcpu" has no readers to place: "scheduler" is refused as a
    CPU list and "vcpus" are (the core sees only Config.reader_cpus, None
    for "scheduler", so the check is Python's), with the one message."""
    with pytest.raises(ConfigError) as e:
        Config(vcpus=2, resolver="vcpu", pin_vcpus="0,1", pin_readers=pins)
    assert str(e.value) == APPLIES_MESSAGE
    assert e.value.field == "pin_readers"
    # The same Config with the readers it names is fine.
    Config(vcpus=2, resolver="readers", pin_vcpus="0,1", pin_readers=pins)
    # Without pin_vcpus too: the rule's error, not "vcpus"' call for pin_vcpus,
    # which would not cure it.
    with pytest.raises(ConfigError) as e:
        Config(vcpus=2, resolver="vcpu", pin_readers=pins)
    assert str(e.value) == APPLIES_MESSAGE


def test_pin_readers_without_a_userfaultfd_is_taken_as_readers_is() -> None:
    """uffd_mode=None has no readers either, and readers=2 or a CPU list is
    taken there (the core's rule names resolver only): so are the words,
    and neither places a reader."""
    for pins in ("scheduler", "vcpus", [0]):
        c = Config(uffd_mode=None, pin_vcpus="0", pin_readers=pins)
        assert not c.readers_with_vcpus
    assert Config(uffd_mode=None, pin_vcpus="0", pin_readers="vcpus").reader_cpus is None


@pytest.mark.parametrize("text", ["sched", "vcpu", "0,x"])
def test_a_misspelt_placement_names_both_words_and_the_list(text) -> None:
    with pytest.raises(ConfigError) as e:
        Config(pin_readers=text)
    assert str(e.value) == (f"pin_readers: {text!r} is not 'vcpus', 'scheduler' or a list "
                            f"of CPU numbers like '0,1'")
    assert e.value.field == "pin_readers"
    with pytest.raises(ConfigError, match="'vcpus', 'scheduler', or a non-empty list"):
        Config(pin_readers=2.5)
    # pin_vcpus takes no words, and its message names none.
    with pytest.raises(ConfigError) as e:
        Config(pin_vcpus=text)
    assert "scheduler" not in str(e.value)


def test_the_cli_names_both_words_for_a_misspelt_placement(capsys) -> None:
    from uffdkvm.cli import build_parser
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--pin-readers", "sched"])
    assert "'sched' is not 'vcpus', 'scheduler' or a list of CPU numbers" in \
        capsys.readouterr().err


def test_cli_main_thread_cpu_with_resolver_vcpu(two_cpus) -> None:
    """-c's main-thread entry leaves the readers to the scheduler; with
    resolver vcpu there are none, and the run is not refused for it."""
    import subprocess
    p = subprocess.run(uffdkvm_command("-q", "-v", "2", "-b", "4M", "--resolver", "vcpu",
                                       "-c", f"{CPUS[0]},{CPUS[1]},{CPUS[0]}", "--json"),
                       capture_output=True, text=True, env=CHILD_ENV)
    assert p.returncode == 0, p.stderr
    r = uffdkvm.Result.from_json(p.stdout)
    assert r.config.pin_readers is None and r.config.resolver == "vcpu"
    assert r.readers_with_vcpus is False and r.reader_cpus is None


def test_sweep_cli_refuses_a_main_thread_cpu_over_both_resolvers(capsys) -> None:
    from uffdkvm.cli import main
    code = main(["sweep", "-q", "-v", "2", "-b", "4M", "-c", "0,1,0",
                 "--resolver", "readers,vcpu"])
    assert code == 2
    assert "applies to resolver='readers' only" in capsys.readouterr().err


# ---- a Result says where its readers ran (review item 12)

def test_the_result_and_its_frame_say_where_the_default_put_the_readers(two_cpus) -> None:
    """pin_readers is None in the default run and "scheduler" in the other,
    so grouping by pin_readers cannot tell them apart; readers_with_vcpus
    and reader_cpus, recorded in the Result from what the core was handed,
    do, in the run's frame, a sweep's and after a JSON round trip. The
    readers' own affinities confirm each."""
    pins = (CPUS[1], CPUS[0])
    default = small(vcpus=2, readers=2, mem_per_vcpu="1M", pin_vcpus=pins)
    upstream = small(vcpus=2, readers=2, mem_per_vcpu="1M", pin_vcpus=pins,
                     pin_readers="scheduler")
    assert default.config.pin_readers is None
    assert default.readers_with_vcpus is True
    assert default.reader_cpus == (pins[0], pins[0], pins[1], pins[1])
    assert [x.cpus for x in default.readers] == [(pins[x.uffd],) for x in default.readers]
    assert upstream.readers_with_vcpus is False and upstream.reader_cpus is None
    assert all(x.cpus == tuple(CPUS) for x in upstream.readers)
    for r in (default, upstream):
        back = uffdkvm.Result.from_json(r.to_json())
        assert back == r
        assert (back.readers_with_vcpus, back.reader_cpus) == \
            (r.readers_with_vcpus, r.reader_cpus)
        row = back.to_frame().iloc[0]
        assert row["readers_with_vcpus"] == r.readers_with_vcpus
        assert row["reader_cpus"] == r.reader_cpus
        assert "result_readers_with_vcpus" not in row.index  # one name, one column


def test_frame_columns_come_from_the_result_not_the_config(two_cpus) -> None:
    """JSON from before the Result recorded the placement (the keys
    missing) reads as None, unknown: then pin_readers=None meant the
    scheduler's placement, and Config.readers_with_vcpus would misread it."""
    import json
    r = small(vcpus=1, mem_per_vcpu="1M", pin_vcpus=(CPUS[0],))
    assert r.config.readers_with_vcpus and r.readers_with_vcpus
    data = json.loads(r.to_json())
    del data["readers_with_vcpus"], data["reader_cpus"]
    old = uffdkvm.Result.from_json(json.dumps(data))
    assert old.readers_with_vcpus is None and old.reader_cpus is None
    row = old.to_frame().iloc[0]
    assert row["readers_with_vcpus"] is None and row["reader_cpus"] is None


def test_json_that_contradicts_itself_on_the_placement_is_refused(two_cpus) -> None:
    import json
    r = small(vcpus=1, mem_per_vcpu="1M", pin_vcpus=(CPUS[0],))
    data = json.loads(r.to_json())
    with pytest.raises(uffdkvm.ResultError, match="readers_with_vcpus"):
        uffdkvm.Result.from_json(json.dumps({**data, "reader_cpus": None}))
    with pytest.raises(uffdkvm.ResultError, match="reader_cpus: an empty list"):
        uffdkvm.Result.from_json(json.dumps({**data, "reader_cpus": []}))


def test_a_sweep_over_pin_readers_tells_the_placements_apart(two_cpus) -> None:
    from uffdkvm.analysis.sweep import points as sweep_points
    points = sweep_points(Config(vcpus=2, mem_per_vcpu="1M", pin_vcpus="0,1"),
                            pin_readers=[None, "scheduler", "vcpus"])
    assert [p.pin_readers for p in points] == [None, "scheduler", "vcpus"]
    df = uffdkvm.sweep(Config(vcpus=2, mem_per_vcpu="1M", pin_vcpus=(CPUS[0], CPUS[1])),
                       pin_readers=[None, "scheduler", "vcpus"], progress=False)
    assert df["error"].isna().all(), df["error"].tolist()
    assert df["readers_with_vcpus"].tolist() == [True, False, True]
    assert df.groupby("readers_with_vcpus", dropna=False).size().to_dict() == \
        {False: 1, True: 2}
