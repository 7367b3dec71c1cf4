"""Config: defaults, normalisation, and bad input that fails early and says what to do.

(test_config.py and test_validation.py were one topic: merged here.)

Every Config field's bad type, range or combination is a ConfigError (a
ValueError) whose message starts with the field's name and says the fix,
raised before any VM, thread or fd exists. What only the host can judge
(KVM's vCPU limit, the memory it has, huge page reservations, the CPUs this
process may use) fails in run() the same way, leaving nothing behind.
"""
import dataclasses
import fcntl
import json
import math
import os
import shutil
import subprocess

import pytest
from helpers.children import ENV as CHILD_ENV
from helpers.children import python
from helpers.hostfacts import (ALL_CPU_NUMBERS_USABLE, KVM_TAKES_EVERY_CONFIG_VCPUS,
                               NO_HUGEPAGES_1G, NO_HUGEPAGES_2M, NO_MEMAVAILABLE, cpus_unavailable,
                               host_skip, mem_info, missing_tool, nofile_hard_limit_below)
from helpers.resources import assert_released, resources

import uffdkvm
from uffdkvm import Config, ConfigError, HostUnsupportedError

FIELDS = {f.name for f in dataclasses.fields(Config)}

# (fields, the field the message must start with, what the message must say)
BAD = [
    (dict(vcpus=0), "vcpus", "must be between 1 and 4096"),
    (dict(vcpus=-3), "vcpus", "must be between 1 and 4096"),
    (dict(vcpus="2"), "vcpus", "expected an int"),
    (dict(vcpus=2.0), "vcpus", "expected an int"),
    (dict(vcpus=True), "vcpus", "expected an int"),
    (dict(vcpus=None), "vcpus", "expected an int"),
    (dict(mem_per_vcpu=0), "mem_per_vcpu", "between 4096 and"),
    (dict(mem_per_vcpu=-4096), "mem_per_vcpu", "between 4096 and"),
    (dict(mem_per_vcpu=4097), "mem_per_vcpu", "positive multiple of 4096"),
    (dict(mem_per_vcpu="64Q"), "mem_per_vcpu", "e.g. '64M'"),
    (dict(mem_per_vcpu=""), "mem_per_vcpu", "e.g. '64M'"),
    (dict(mem_per_vcpu="-4K"), "mem_per_vcpu", "e.g. '64M'"),
    (dict(mem_per_vcpu=1.5), "mem_per_vcpu", "a string like '64M'"),
    (dict(mem_per_vcpu=b"4K"), "mem_per_vcpu", "a string like '64M'"),
    (dict(mem_per_vcpu=None), "mem_per_vcpu", "a string like '64M'"),
    (dict(backing="tmpfs"), "backing", "'anonymous', 'shmem', 'anonymous_thp'"),
    (dict(backing=None), "backing", "'shmem'"),
    (dict(uffd_mode="writeprotect"), "uffd_mode", "'missing', 'minor', 'wp'"),
    (dict(uffd_mode=1), "uffd_mode", "'missing', 'minor'"),
    (dict(single_uffd=1), "single_uffd", "expected True or False"),
    (dict(single_uffd="yes"), "single_uffd", "expected True or False"),
    (dict(readers=0), "readers", "between 1 and 4096"),
    (dict(readers=4097), "readers", "between 1 and 4096"),
    (dict(readers=2.0), "readers", "expected an int"),
    (dict(read_batch=0), "read_batch", "between 1 and 64"),
    (dict(read_batch=65), "read_batch", "between 1 and 64"),
    (dict(wait="select"), "wait", "'poll', 'epoll', 'epoll_exclusive', 'read'"),
    (dict(resolver="kernel"), "resolver", "'readers', 'vcpu'"),
    (dict(resolver="vcpu", readers=4), "readers",
     "applies to resolver='readers' only, not resolver='vcpu'"),
    (dict(delay_us=-1), "delay_us", "between 0 and 10000000"),
    (dict(delay_us=10_000_001), "delay_us", "between 0 and 10000000"),
    (dict(delay_us=0.5), "delay_us", "expected an int"),
    (dict(delay_dist="normal"), "delay_dist", "'fixed', 'uniform', 'exponential'"),
    (dict(overlap=1), "overlap", "expected True or False"),
    (dict(allow_oversubscribe="yes"), "allow_oversubscribe", "expected True or False"),
    (dict(guest_work=-1), "guest_work", "between 0 and 1000000"),
    (dict(guest_work=10**7), "guest_work", "between 0 and 1000000"),
    (dict(guest_work="1"), "guest_work", "expected an int"),
    (dict(guest_page_size="8K"), "guest_page_size", "'4K', '2M', '1G'"),
    (dict(guest_page_size=8192), "guest_page_size", "'4K', '2M', '1G'"),
    (dict(guest_page_size=None), "guest_page_size", "'4K', '2M', '1G'"),
    (dict(pattern="stride"), "pattern", "'sequential', 'reverse', 'random'"),
    (dict(seed=-1), "seed", "between 0 and 18446744073709551615"),
    (dict(seed=2**64), "seed", "between 0 and 18446744073709551615"),
    (dict(seed=1.0), "seed", "expected an int"),
    (dict(write_percent=101), "write_percent", "between 0 and 100"),
    (dict(write_percent=-1), "write_percent", "between 0 and 100"),
    (dict(write_percent=50.0), "write_percent", "expected an int"),
    (dict(passes=0), "passes", "between 1 and 1000000"),
    (dict(passes=1_000_001), "passes", "between 1 and 1000000"),
    (dict(resolve="remap"), "resolve", "'copy', 'zeropage', 'move'"),
    (dict(pin_vcpus=[]), "pin_vcpus", "non-empty list of CPU numbers"),
    (dict(pin_vcpus="a,b"), "pin_vcpus", "like '0,1'"),
    (dict(pin_vcpus=[-1]), "pin_vcpus", "between 0 and 1023"),
    (dict(pin_vcpus=[1024]), "pin_vcpus", "between 0 and 1023"),
    (dict(pin_vcpus=[0.0]), "pin_vcpus", "expected an int"),
    (dict(pin_vcpus={0}), "pin_vcpus", "a set has no order"),
    (dict(pin_readers=[True]), "pin_readers", "expected an int"),
    (dict(pin_readers=[]), "pin_readers", "non-empty list of CPU numbers"),
    (dict(prefault="no"), "prefault", "expected True or False"),
    (dict(stats="none"), "stats", "'full', 'basic'"),
    (dict(guest_timing=1), "guest_timing", "expected True or False"),
    (dict(trace_faults="yes"), "trace_faults", "expected True or False"),
    (dict(wp_async="yes"), "wp_async", "expected True or False"),
    (dict(wp_async=True), "wp_async", "uffd_mode='wp' only"),
    (dict(touch_percent=0), "touch_percent", "between 1 and 100"),
    (dict(touch_percent=101), "touch_percent", "between 1 and 100"),
    (dict(touch_percent="50"), "touch_percent", "expected an int"),
    (dict(access="pareto"), "access", "'uniform', 'zipf'"),
    (dict(zipf_theta=0.99), "zipf_theta", "set access='zipf'"),
    (dict(access="zipf", zipf_theta="hot"), "zipf_theta", "expected a number"),
    (dict(access="zipf", zipf_theta=-1.0), "zipf_theta", "above 0"),
    (dict(accesses=100), "accesses", "set access='zipf'"),
    (dict(access="zipf", zipf_theta=0.99, accesses=0), "accesses", "between 1"),
    (dict(timeout_s=0), "timeout_s", "a positive number of seconds"),
    (dict(timeout_s=-1.0), "timeout_s", "a positive number of seconds"),
    (dict(timeout_s=math.nan), "timeout_s", "a positive number of seconds"),
    (dict(timeout_s="60"), "timeout_s", "a positive number of seconds"),
    (dict(timeout_s=True), "timeout_s", "a positive number of seconds"),
    (dict(source="disk"), "source", "'synthetic', 'file', 'remote'"),
    (dict(source="remote"), "source_path", "uffdkvm.make_snapshot(path"),
    (dict(remote_latency_us=30), "remote_latency_us", "applies to source='remote' only"),
    (dict(source="file", source_path="/x", max_inflight=2), "max_inflight",
     "applies to source='remote' only"),
    (dict(source="remote", source_path="/x", source_cache="cold"), "source_cache",
     "applies to source='file' only"),
    (dict(source="remote", source_path="/x", uffd_mode="minor", backing="shmem"), "source",
     "'remote' supplies the data of missing faults"),
    (dict(source="file"), "source_path", "uffdkvm.make_snapshot(path"),
    (dict(source="file", source_path=3), "source_path", "a str or os.PathLike"),
    (dict(source_path="/var/tmp/x.img"), "source_path",
     "applies to source='file' or source='remote' only"),
    (dict(source_read="aio"), "source_read", "'pread', 'mmap'"),
    (dict(source_read="mmap"), "source_read", "applies to source='file' only"),
    (dict(source_cache="hot"), "source_cache", "'warm', 'cold'"),
    (dict(source_cache="cold"), "source_cache", "applies to source='file' only"),
    (dict(prefetch="eager"), "prefetch", "'none', 'readahead', 'background', 'replay'"),
    (dict(prefetch=None), "prefetch", "'none', 'readahead'"),
    (dict(prefetch_pages=0), "prefetch_pages", "between 1 and 1048576"),
    (dict(prefetch_pages=4), "prefetch_pages", "set prefetch='readahead'"),
    (dict(prefetch="readahead", prefetch_pages=2.0), "prefetch_pages", "expected an int"),
    (dict(prefetch_bandwidth_mbps=-1), "prefetch_bandwidth_mbps", "between 0 and"),
    (dict(prefetch_bandwidth_mbps=10), "prefetch_bandwidth_mbps",
     "or leave prefetch_bandwidth_mbps at its default (0)"),
    (dict(prefetch="readahead", prefetch_bandwidth_mbps=10), "prefetch_bandwidth_mbps",
     "applies to prefetch='background' or prefetch='replay' only"),
    (dict(replay_from=[1, 2]), "replay_from", "prefetch='replay' only"),
    (dict(prefetch="replay"), "replay_from", "needs the order"),
    (dict(prefetch="replay", replay_from=[3, 3]), "replay_from", "entry 1 repeats page 3"),
    (dict(prefetch="replay", replay_from=[10**9]), "replay_from", "beyond the region's"),
    (dict(prefetch="replay", replay_from=[-1]), "replay_from", "not a page index"),
    (dict(prefetch="replay", replay_from=[]), "replay_from", "no pages"),
    (dict(prefetch="replay", replay_from=5), "replay_from", "a sequence of page indices"),
    (dict(prefetch="replay", replay_from="/nonexistent/order.txt"), "replay_from",
     "cannot read"),
    (dict(remote_transport="udp"), "remote_transport", "'unix', 'tcp'"),
    (dict(remote_transport=None), "remote_transport", "'unix', 'tcp'"),
    (dict(remote_latency_us=-1), "remote_latency_us", "between 0 and 10000000"),
    (dict(remote_latency_us=10_000_001), "remote_latency_us", "between 0 and 10000000"),
    (dict(remote_latency_us=1.5), "remote_latency_us", "expected an int"),
    (dict(remote_bandwidth_mbps=-1), "remote_bandwidth_mbps", "between 0 and 1000000000"),
    (dict(remote_bandwidth_mbps="fast"), "remote_bandwidth_mbps", "expected an int"),
    (dict(max_inflight=-1), "max_inflight", "between 0 and 1000000"),
    (dict(max_inflight=True), "max_inflight", "expected an int"),
]

# Values that are fine alone and wrong together.
BAD_COMBINATIONS = [
    (dict(uffd_mode="minor"), "uffd_mode", "Use backing='shmem' or uffd_mode='missing'"),
    (dict(uffd_mode="minor", backing="anonymous_thp", mem_per_vcpu="2M"), "uffd_mode",
     "Use backing='shmem'"),
    (dict(resolve="zeropage", uffd_mode="minor", backing="shmem"), "resolve",
     "use uffd_mode='missing' or resolve='copy'"),
    (dict(resolve="zeropage", uffd_mode=None), "resolve",
     "use uffd_mode='missing' or resolve='copy'"),
    (dict(resolve="zeropage", backing="anonymous_hugetlb", mem_per_vcpu="2M"), "resolve",
     "use resolve='copy'"),
    (dict(trace_faults=True, stats="basic"), "trace_faults", "applies to stats='full' only"),
    (dict(backing="anonymous_hugetlb", mem_per_vcpu="1M"), "mem_per_vcpu",
     "positive multiple of 2097152"),
    (dict(backing="anonymous_hugetlb_1gb", mem_per_vcpu="512M"), "mem_per_vcpu",
     "positive multiple of 1073741824"),
    (dict(guest_page_size="2M", mem_per_vcpu="1M"), "mem_per_vcpu",
     "multiple of 2097152"),
    (dict(prefetch="readahead", resolve="zeropage"), "prefetch", "resolve='copy'"),
    (dict(prefetch="background", uffd_mode="minor", backing="shmem"), "prefetch",
     "needs uffd_mode='missing'"),
    (dict(prefetch="background", uffd_mode=None), "prefetch", "needs uffd_mode='missing'"),
    (dict(prefetch="readahead", prefault=True), "prefetch", "prefault=True"),
]


@pytest.fixture
def no_core(monkeypatch):
    """Fails the test if anything reaches the C core: what Python can judge
    must be refused before a VM, a thread or an fd exists."""
    def refuse(*args, **kwargs):
        raise AssertionError("the C core was called for a config Python should refuse")
    monkeypatch.setattr(uffdkvm._core, "run", refuse)
    monkeypatch.setattr(uffdkvm._core, "probe", refuse)


def check(error, field, fix):
    message = str(error)
    assert isinstance(error, ConfigError) and isinstance(error, ValueError)
    assert message.startswith(field + ": "), message
    assert error.field == field, (error.field, message)
    assert fix in message, message


def check_host(error, field, fix):
    """What this host cannot give a valid Config: a HostUnsupportedError (not
    a ConfigError: the same Config runs on a larger host) naming the field."""
    message = str(error)
    assert type(error) is HostUnsupportedError, type(error)
    assert message.startswith(field + ": "), message
    assert fix in message, message


@pytest.mark.parametrize("fields,field,fix", BAD + BAD_COMBINATIONS,
                         ids=[repr(fields)[1:-1][:60] for fields, _, _ in BAD + BAD_COMBINATIONS])
def test_a_bad_field_is_a_config_error_that_names_it_and_the_fix(no_core, fields, field, fix):
    before = resources()
    with pytest.raises(ConfigError) as info:
        Config(**fields)
    check(info.value, field, fix)
    # The same through run() and probe(), by keywords and as an override.
    for call in (lambda: uffdkvm.run(**{"mem_per_vcpu": "64K", **fields}),
                 lambda: uffdkvm.run(Config(mem_per_vcpu="64K"), **fields),
                 lambda: uffdkvm.probe(**{"mem_per_vcpu": "64K", **fields})):
        with pytest.raises(ConfigError) as info:
            call()
        check(info.value, field, fix)
    assert_released(before)


def schema_bad_value(f):
    """A value of the wrong kind, or past the schema's range, for field f."""
    if f.kind in ("u32", "u64", "double") and f.max is not None:
        return f.max * 2 + 1
    return {"bool": "yes", "enum": "bogus"}.get(f.kind, object())


@pytest.mark.parametrize("f", uffdkvm.schema.fields.CONFIG_FIELDS, ids=lambda f: f.name)
def test_every_field_refuses_a_bad_value_naming_itself(no_core, f):
    """Every field of the schema, one bad value each, from the schema itself
    (so a new field is covered the moment it is declared); BAD above has the
    hand-picked ones."""
    fields = {f.name: schema_bad_value(f)}
    if f.applies:  # where it applies, so the value itself is what is refused
        other, values = f.applies[0]
        fields[other] = uffdkvm.schema.fields.python_value(uffdkvm.schema.fields.BY_NAME[other], values[0])
        if other == "source":
            fields["source_path"] = "/var/tmp/x.img"
        if other == "access":
            fields["zipf_theta"] = 0.99
    with pytest.raises(ConfigError) as info:
        Config(**{**fields, f.name: schema_bad_value(f)})
    assert info.value.field == f.name, str(info.value)


def test_an_unknown_field_lists_the_real_ones(no_core):
    with pytest.raises(ConfigError) as info:
        uffdkvm.run(mem_per_vcpu="64K", reader=4)
    assert str(info.value).startswith("reader: not a Config field; fields are vcpus, ")
    with pytest.raises(TypeError):
        Config(reader=4)  # a dataclass: Python's own error for an unknown keyword


@pytest.mark.parametrize("value", [{"vcpus": 2}, "vcpus=2", 2, None.__class__])
def test_a_positional_argument_must_be_a_config(no_core, value):
    with pytest.raises(ConfigError, match="expected a uffdkvm.Config"):
        uffdkvm.run(value)


def test_uffd_mode_error_lists_every_accepted_value(no_core):
    with pytest.raises(ConfigError) as info:
        Config(uffd_mode="writeprotect")
    assert "None" in str(info.value), str(info.value)


# ---- what only the host can judge ----

KVM_CHECK_EXTENSION = 0xAE03
KVM_CAP_MAX_VCPUS = 66


def kvm_max_vcpus():
    with open("/dev/kvm", "rb", buffering=0) as kvm:
        return fcntl.ioctl(kvm.fileno(), KVM_CHECK_EXTENSION, KVM_CAP_MAX_VCPUS)


def test_vcpus_beyond_kvms_limit(kvm):
    limit = kvm_max_vcpus()
    before = resources()
    with pytest.raises(ConfigError) as info:
        uffdkvm.run(vcpus=limit + 1, mem_per_vcpu="4K")
    if limit >= uffdkvm.schema.fields.LIMITS["MAX_VCPUS"]:
        # A KVM built with the highest limit (Debian's 6.12: 4096): the
        # config's own range, which is KVM's ceiling, refuses first.
        check(info.value, "vcpus", f"must be between 1 and {limit}, not {limit + 1}")
    else:
        check(info.value, "vcpus", f"allows at most {limit} vCPUs per VM, not {limit + 1}")
    assert_released(before)


# The child caps its address space a little above what it uses: a core that
# sized and mapped the system memslot for 4096 vCPUs (some 80 MiB, reserved
# but never touched) before asking KVM for its limit fails there with a
# RunError (mmap: ENOMEM) instead of the ConfigError.
ADDRESS_SPACE_CHILD = """
import json, resource, time, uffdkvm
uffdkvm.run(vcpus=1, mem_per_vcpu="64K")  # threads, arenas and caches made once
with open("/proc/self/status") as f:
    size = next(int(l.split()[1]) << 10 for l in f if l.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (size + (32 << 20), resource.RLIM_INFINITY))
start = time.monotonic()
try:
    uffdkvm.run(vcpus=VCPUS, mem_per_vcpu="4K")
    out = {"ran": True}
except uffdkvm.UffdkvmError as e:
    out = {"type": type(e).__name__, "error": str(e)}
out["seconds"] = time.monotonic() - start
print(json.dumps(out))
"""


def test_vcpus_beyond_kvms_limit_fail_before_anything_is_sized_for_them(kvm):
    """KVM's limit is asked first: nothing is sized from vcpus, so a process
    whose address space could not hold memory for them still gets the
    ConfigError, and at once."""
    limit = kvm_max_vcpus()
    vcpus = 4096  # the most a Config takes
    if vcpus <= limit:
        host_skip(KVM_TAKES_EVERY_CONFIG_VCPUS,
                  f"this host's KVM allows {limit} vCPUs: a Config cannot ask for more")
    p = subprocess.run(python(code=ADDRESS_SPACE_CHILD.replace("VCPUS", str(vcpus))),
                       capture_output=True, text=True, timeout=120,
                       env={**CHILD_ENV, "MALLOC_ARENA_MAX": "1"})
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out.get("type") == "ConfigError", out
    assert out["error"].startswith(f"vcpus: this host's KVM allows at most {limit} vCPUs per "
                                   f"VM, not {vcpus}"), out
    assert out["seconds"] < 2.0, out


FD_CHILD = """
import errno, json, os, resource, time, uffdkvm
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
tasks = len(os.listdir("/proc/self/task"))
start = time.monotonic()
out = {"hard": hard}
try:
    uffdkvm.run(vcpus=64, mem_per_vcpu="64K", readers=16)
except uffdkvm.UffdkvmError as e:
    out.update(type=type(e).__name__, emfile=e.errno == errno.EMFILE, error=str(e))
out["seconds"] = time.monotonic() - start
out["tasks"] = [tasks, len(os.listdir("/proc/self/task"))]
print(json.dumps(out))
"""


def test_more_fds_than_the_soft_limit_allows_fail_before_anything_is_built(kvm):
    """64 vCPUs x 16 readers need some 1300 fds; under the common soft limit
    of 1024 the run says so at once, with the numbers and the fix, instead
    of meeting EMFILE halfway through building them."""
    p = subprocess.run(python(code=FD_CHILD), capture_output=True, text=True,
                       timeout=120, env=CHILD_ENV)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    if out["hard"] != -1 and out["hard"] < 2048:
        host_skip(nofile_hard_limit_below(2048), f"the hard limit here is {out['hard']}")
    assert out.get("type") == "HostUnsupportedError" and out["emfile"], out
    message = out["error"]
    assert message.startswith("this run needs 1284 more file descriptors (3 for KVM, the VM "
                              "and its statistics, 128 for 64 vCPUs and their statistics, "
                              "1152 for 64 uffds with their stop eventfds and an epoll set "
                              "per reader, 1 while setting up), and this process can open "
                              "only "), message
    hard = "unlimited" if out["hard"] == -1 else out["hard"]
    assert f"its soft limit RLIMIT_NOFILE is 1024 (hard limit {hard})" in message, message
    assert "'ulimit -n 2048'" in message, message
    assert "resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))" in message, message
    assert message.endswith("or use fewer readers or vCPUs"), message
    assert out["seconds"] < 1.0, out
    assert out["tasks"][1] == out["tasks"][0], "threads were started"


@pytest.mark.parametrize("overlap", [False, True])
def test_memory_the_host_does_not_have(no_core, overlap):
    available = mem_info("MemAvailable")
    if available is None:
        host_skip(NO_MEMAVAILABLE, "no MemAvailable in /proc/meminfo")
    per_vcpu = (available // 2 // (1 << 30) + 1) << 30  # two of these are too much
    if overlap:
        per_vcpu *= 2
    with pytest.raises(HostUnsupportedError) as info:
        uffdkvm.run(vcpus=2, mem_per_vcpu=per_vcpu, overlap=overlap)
    check_host(info.value, "mem_per_vcpu", "MemAvailable")
    assert "use less memory per vCPU or fewer vCPUs" in str(info.value)
    assert ("(mem_per_vcpu)" if overlap else "(vcpus * mem_per_vcpu)") in str(info.value)


def hugetlb_pool(backing):
    size_kb = 1 << 20 if backing == "anonymous_hugetlb_1gb" else 2048
    base = f"/sys/kernel/mm/hugepages/hugepages-{size_kb}kB"
    try:
        with open(f"{base}/free_hugepages") as f:
            return base, size_kb << 10, int(f.read())
    except OSError:
        host_skip(NO_HUGEPAGES_1G if size_kb == 1 << 20 else NO_HUGEPAGES_2M,
                  f"this kernel has no {size_kb} kB huge page pool")


# alone: another worker's 1 GiB page coming back meanwhile would make "one more than
# is free" fit.
@pytest.mark.alone
@pytest.mark.parametrize("backing", ["anonymous_hugetlb", "shared_hugetlb",
                                     "anonymous_hugetlb_1gb"])
def test_huge_pages_not_reserved(kvm, backing):
    base, page, free = hugetlb_pool(backing)
    # Well beyond what is free, so that another test growing the pool meanwhile
    # does not matter; the run must fail before it maps anything. 1 GiB pages:
    # one more than is free (a pool reserved at boot does not grow), so that
    # the run still fits in the memory of a guest that has one.
    need = free + (1 if page == 1 << 30 else 1024)
    before = resources()
    with pytest.raises(HostUnsupportedError) as info:
        uffdkvm.run(mem_per_vcpu=need * page, backing=backing)
    message = str(info.value)
    assert f"needs {need} free huge pages" in message, message
    assert f"{base}/nr_hugepages" in message, message
    assert message.startswith(f"backing {backing} "), message
    assert_released(before)


def test_pinning_to_a_cpu_that_does_not_exist(no_core):
    missing = max(os.sched_getaffinity(0)) + 1
    if missing > 1023:
        host_skip(ALL_CPU_NUMBERS_USABLE, "every CPU number a Config takes is usable here")
    for field in ("pin_vcpus", "pin_readers"):
        with pytest.raises(HostUnsupportedError) as info:
            uffdkvm.run(mem_per_vcpu="64K", **{field: [0, missing]})
        check_host(info.value, field, f"CPU {missing} is not one this process may run on")


PINNED_CHILD = """
import json, uffdkvm
try:
    uffdkvm.run(mem_per_vcpu="64K", FIELD=[1])
    print(json.dumps({"ran": True}))
except uffdkvm.HostUnsupportedError as e:
    print(json.dumps({"error": str(e)}))
"""


@pytest.mark.parametrize("field", ["pin_vcpus", "pin_readers"])
def test_pinning_to_a_cpu_outside_the_process_affinity(kvm, field):
    """A process started on CPU 0 only (taskset, a cpuset) may not pin to CPU 1."""
    if len(os.sched_getaffinity(0)) < 2 or 1 not in os.sched_getaffinity(0):
        host_skip(cpus_unavailable(0, 1), "needs CPUs 0 and 1")
    if not shutil.which("taskset"):
        host_skip(missing_tool("taskset"), "needs taskset (util-linux)")
    p = subprocess.run(["taskset", "-c", "0",
                        *python(code=PINNED_CHILD.replace("FIELD", field))],
                       capture_output=True, text=True, timeout=60, env=CHILD_ENV)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out.get("error", "").startswith(
        f"{field}: CPU 1 is not one this process may run on (it may use 0)"), out


# ---- sizes past what the core can represent ----

@pytest.mark.parametrize("fields,field", [
    (dict(vcpus=2**32, mem_per_vcpu="2M", backing="anonymous_hugetlb"), "vcpus"),
    (dict(mem_per_vcpu=2**64, backing="shared_hugetlb"), "mem_per_vcpu"),
    (dict(vcpus=3, mem_per_vcpu=2**63, backing="anonymous_hugetlb"), "mem_per_vcpu"),
], ids=["vcpus-2**32", "mem-2**64", "product-overflows"])
def test_sizes_past_the_cores_integers_are_config_errors(kvm, fields, field):
    with pytest.raises(ConfigError) as info:
        uffdkvm.run(**fields)
    assert str(info.value).startswith(field + ": "), str(info.value)


def test_a_hugetlb_region_larger_than_the_host_is_a_host_error(kvm):
    total = mem_info("MemTotal")
    with pytest.raises(HostUnsupportedError) as info:
        uffdkvm.run(mem_per_vcpu=((total >> 30) + 2) << 30, backing="anonymous_hugetlb")
    assert str(info.value).startswith("mem_per_vcpu: "), str(info.value)


# ---- defaults, forms and derived values ----

def test_defaults_match_the_documented_ones():
    c = Config()
    assert (c.vcpus, c.mem_per_vcpu, c.backing, c.uffd_mode, c.single_uffd, c.readers,
            c.wait, c.reader_wait, c.delay_us, c.overlap) == (
        1, 1 << 30, "anonymous", "missing", False, 1, None, "epoll_exclusive", 0, False)


@pytest.mark.parametrize("text,expected", [
    ("64M", 64 << 20), ("1G", 1 << 30), ("4096", 4096), ("16k", 16 << 10),
    ("2GiB", 2 << 30), (" 8 M ", 8 << 20), (12288, 12288),
])
def test_sizes_parse_to_bytes(text, expected):
    assert Config(mem_per_vcpu=text).mem_per_vcpu == expected


def test_names_are_case_insensitive_and_none_means_no_uffd():
    c = Config(backing="SHMEM", uffd_mode="MINOR", wait="Poll")
    assert (c.backing, c.uffd_mode, c.wait) == ("shmem", "minor", "poll")
    assert Config(uffd_mode="none").uffd_mode is None


def test_config_is_frozen_and_replace_validates():
    c = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.vcpus = 3
    assert c.replace(vcpus=3).vcpus == 3
    with pytest.raises(ConfigError, match="vcpus"):
        c.replace(vcpus=0)
    with pytest.raises(ConfigError, match="not a Config field"):
        c.replace(vcpu=2)


@pytest.mark.parametrize("fields,field", [
    (dict(vcpus=0), "vcpus"),
    (dict(vcpus="2"), "vcpus"),
    (dict(vcpus=True), "vcpus"),
    (dict(vcpus=5000), "vcpus"),
    (dict(vcpus=64, mem_per_vcpu="2T"), "mem_per_vcpu"),
    (dict(mem_per_vcpu="64Q"), "mem_per_vcpu"),
    (dict(mem_per_vcpu=1000), "mem_per_vcpu"),
    (dict(mem_per_vcpu=0), "mem_per_vcpu"),
    (dict(mem_per_vcpu=1.5), "mem_per_vcpu"),
    (dict(backing="tmpfs"), "backing"),
    (dict(uffd_mode="writeprotect"), "uffd_mode"),
    (dict(uffd_mode="minor"), "uffd_mode"),  # on anonymous memory
    (dict(single_uffd="yes"), "single_uffd"),
    (dict(readers=0), "readers"),
    (dict(readers=100000), "readers"),
    (dict(wait="select"), "wait"),
    (dict(delay_us=-1), "delay_us"),
    (dict(delay_us=10**9), "delay_us"),
    (dict(overlap=1), "overlap"),
    (dict(guest_work=-1), "guest_work"),
    (dict(guest_work=10**7), "guest_work"),
    (dict(timeout_s=0), "timeout_s"),
    (dict(timeout_s="soon"), "timeout_s"),
])
def test_bad_values_raise_a_value_error_naming_the_field(fields, field):
    with pytest.raises(ValueError) as info:
        Config(**fields)
    assert isinstance(info.value, uffdkvm.UffdkvmError)
    assert str(info.value).startswith(field + ":"), str(info.value)


def test_minor_on_anonymous_says_how_to_fix_it():
    with pytest.raises(ConfigError, match="backing='shmem'"):
        Config(uffd_mode="minor")


def test_run_rejects_what_is_not_a_config():
    with pytest.raises(ConfigError, match="Config"):
        uffdkvm.run({"vcpus": 2})
    with pytest.raises(ConfigError, match="not a Config field"):
        uffdkvm.run(vcpu=2)


def test_a_region_larger_than_the_host_is_refused_before_anything_runs():
    with pytest.raises(uffdkvm.HostUnsupportedError, match="MemAvailable"):
        uffdkvm.run(vcpus=64, mem_per_vcpu="64G")


def test_derived_sizes():
    c = Config(vcpus=4, mem_per_vcpu="64M")
    assert (c.region_bytes, c.pages_per_vcpu, c.uffds) == (256 << 20, 16384, 4)
    assert Config(vcpus=4, overlap=True).uffds == 1
    assert Config(vcpus=4, single_uffd=True).uffds == 1
    assert Config(vcpus=4, uffd_mode=None).uffds == 0
    assert Config(vcpus=4, mem_per_vcpu="64M", overlap=True).region_bytes == 64 << 20
