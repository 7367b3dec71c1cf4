"""A host that lacks KVM or userfaultfd gets a HostUnsupportedError that says
what is missing and what to do, not a crash.

Each case builds the broken host for real (tests/helpers/broken_host.py): a private
mount namespace with a tmpfs over /dev holding only the device nodes the case
allows, and capabilities dropped with setpriv, or a real unprivileged user.
The process inside imports a copy of the uffdkvm this session imported, so
these run wherever the package is installed. Needs root and util-linux.
"""
import json
import os
import re
import sys

import pytest

from helpers.broken_host import (KVM, KVM_DEV, KVM_GROUP, KVM_ROOT_ONLY, NOBODY, USERFAULTFD,
                                 USERFAULTFD_DEV, USERFAULTFD_OWNED, Stage, skip_unless_namespaces)
from helpers.hostfacts import (NO_DEV_USERFAULTFD, NO_HUGEPAGES_2M, UNPRIVILEGED_USERFAULTFD,
                               host_skip)

pytestmark = pytest.mark.kvm

PROBE = """
import json, uffdkvm
try:
    r = uffdkvm.run(mem_per_vcpu="64K")
    print(json.dumps({"ok": r.verified}))
except uffdkvm.UffdkvmError as e:
    print(json.dumps({"error": type(e).__name__, "errno": e.errno, "message": str(e)}))
"""


@pytest.fixture(scope="module")
def stage():
    skip_unless_namespaces()
    s = Stage()
    yield s
    s.remove()


@pytest.fixture
def broken_host(kvm, stage):
    """run(devices, drop_caps=(), user=None, probe=PROBE): the probe's JSON
    line from a broken host (see Stage.run)."""
    def run(devices, drop_caps=(), user=None, probe=PROBE):
        p = stage.run(devices, stage.python("-c", probe), drop_caps=drop_caps, user=user)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout.strip().splitlines()[-1])
    return run


def test_the_staged_device_numbers_are_the_kernels():
    """The nodes a broken host gets carry the numbers of the kernel's own
    /dev/kvm and /dev/userfaultfd (userfaultfd's minor is dynamic: a node
    with another number opens as ENXIO, and the cases granting it fail)."""
    if USERFAULTFD_DEV is None:
        host_skip(NO_DEV_USERFAULTFD, "compares the staged /dev/userfaultfd with the kernel's")
    for name, dev in [("kvm", KVM_DEV), ("userfaultfd", USERFAULTFD_DEV)]:
        rdev = os.stat(f"/dev/{name}").st_rdev
        assert (os.major(rdev), os.minor(rdev)) == dev, name


def test_no_dev_kvm(broken_host):
    out = broken_host([])
    assert out["error"] == "HostUnsupportedError"
    assert out["errno"] == 2
    assert out["message"].startswith("open(/dev/kvm): No such file or directory")
    assert "kvm_intel or kvm_amd" in out["message"]


def test_dev_kvm_not_permitted(broken_host):
    out = broken_host([("kvm", KVM_DEV, "000")],
                      drop_caps=("dac_override", "dac_read_search"))
    assert out["error"] == "HostUnsupportedError"
    assert out["errno"] == 13
    assert "read/write access to /dev/kvm" in out["message"]


def skip_if_userfaultfd_is_open_to_all():
    if UNPRIVILEGED_USERFAULTFD.holds:
        host_skip(UNPRIVILEGED_USERFAULTFD,
                  "vm.unprivileged_userfaultfd=1 here: the syscall is open to everyone")


def test_userfaultfd_not_permitted(broken_host):
    skip_if_userfaultfd_is_open_to_all()
    out = broken_host([KVM], drop_caps=("sys_ptrace",))
    assert out["error"] == "HostUnsupportedError"
    assert out["errno"] == 1
    assert out["message"].startswith("userfaultfd(): Operation not permitted")
    assert "/dev/userfaultfd" in out["message"]


def test_dev_userfaultfd_grants_what_the_syscall_refuses(broken_host):
    """The least a non-root user needs: /dev/kvm and /dev/userfaultfd."""
    out = broken_host([KVM, USERFAULTFD], drop_caps=("sys_ptrace",))
    assert out == {"ok": True}


# ---- a real unprivileged user: what docs/robustness.md's "Privileges" promises ----

WHO = """
import json, sys, uffdkvm
print(json.dumps({"uffdkvm": uffdkvm.__file__, "version": list(sys.version_info)}))
"""


@pytest.fixture(scope="module")
def unprivileged(stage):
    """The unprivileged user runs this very Python on this session's uffdkvm,
    wherever either is installed (else every test below would be moot)."""
    p = stage.run([], stage.python("-c", WHO), user=NOBODY)
    assert p.returncode == 0, (f"uid {NOBODY} cannot run {sys.executable} on the staged "
                               f"uffdkvm in {stage.pythonpath}: {p.stderr}")
    who = json.loads(p.stdout.strip().splitlines()[-1])
    assert who["uffdkvm"].startswith(str(stage.pythonpath)), who
    assert who["version"] == list(sys.version_info), who


def test_a_user_with_kvm_and_dev_userfaultfd_runs(broken_host, unprivileged):
    out = broken_host([KVM_GROUP, USERFAULTFD_OWNED], user=NOBODY)
    assert out == {"ok": True}


def test_a_user_with_kvm_only_is_told_about_dev_userfaultfd(broken_host, unprivileged):
    skip_if_userfaultfd_is_open_to_all()
    out = broken_host([KVM_GROUP], user=NOBODY)
    assert out["error"] == "HostUnsupportedError" and out["errno"] == 1
    assert "/dev/userfaultfd" in out["message"]
    assert "vm.unprivileged_userfaultfd=1" in out["message"]


def test_a_user_without_access_to_dev_kvm_is_told(broken_host, unprivileged):
    out = broken_host([KVM_ROOT_ONLY, USERFAULTFD_OWNED], user=NOBODY)
    assert out["error"] == "HostUnsupportedError" and out["errno"] == 13
    assert "read/write access to /dev/kvm" in out["message"]


HUGETLB_PROBE = """
import json, uffdkvm
out = {}
for backing, mode in [("anonymous_hugetlb", "missing"), ("shared_hugetlb", "minor")]:
    try:
        out[backing] = uffdkvm.run(mem_per_vcpu="2M", backing=backing, uffd_mode=mode).verified
    except uffdkvm.UffdkvmError as e:
        out[backing] = str(e)
try:
    open("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "w").write("0")
    out["reserve"] = "allowed"
except OSError as e:
    out["reserve"] = e.errno
print(json.dumps(out))
"""


@pytest.mark.alone  # counts the free 2 MiB pages first: no other worker may take them
def test_huge_pages_reserved_by_root_serve_an_unprivileged_user(broken_host, hugepages,
                                                               unprivileged):
    """Reserving huge pages takes root, once; using them takes nothing."""
    with open("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages") as f:
        if int(f.read()) < 1:
            host_skip(NO_HUGEPAGES_2M, "no free 2 MiB huge page")
    out = broken_host([KVM_GROUP, USERFAULTFD_OWNED], user=NOBODY, probe=HUGETLB_PROBE)
    assert out == {"anonymous_hugetlb": True, "shared_hugetlb": True, "reserve": 13}


NPROC_PROBE = """
import json, os, resource, time, uffdkvm
from uffdkvm import _core, config

def counts():
    return [len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))]

resource.setrlimit(resource.RLIMIT_NPROC, (12, 12))  # threads count too
before, out = counts(), {}
big = uffdkvm.Config(vcpus=16, mem_per_vcpu="64K", single_uffd=True)
try:
    uffdkvm.run(big)
    out["checked"] = "ran"
except uffdkvm.UffdkvmError as e:
    out["checked"] = [type(e).__name__, e.errno, str(e)]
try:  # the core itself, the check bypassed: the thread it cannot make
    _core.run(config.core_config(big))
    out["ok"] = True
except _core.CoreError as e:
    out.update(error="RunError" if e.args[0] == _core.ERR_RUN else str(e.args[0]),
               errno=e.args[1], message=e.args[2])
time.sleep(0.05)
out["released"] = counts() == before
out["next"] = uffdkvm.run(vcpus=4, mem_per_vcpu="64K", readers=2, single_uffd=True).verified
print(json.dumps(out))
"""


def test_a_users_thread_limit_fails_the_run_naming_the_thread(broken_host, unprivileged):
    """RLIMIT_NPROC (ulimit -u) counts threads: run() refuses a run past it
    before it starts, naming the limit and the fix; the core called past the
    check fails for real with EAGAIN from pthread_create, named, and gives
    back what it made."""
    out = broken_host([KVM_GROUP, USERFAULTFD_OWNED], user=NOBODY, probe=NPROC_PROBE)
    kind, errnum, message = out["checked"]
    assert kind == "HostUnsupportedError" and errnum == 11, out
    assert "starts 19 threads" in message and "RLIMIT_NPROC (ulimit -u) = 12" in message, out
    assert "ulimit -u" in message and "resource.setrlimit(resource.RLIMIT_NPROC" in message
    assert out["error"] == "RunError" and out["errno"] == 11, out
    assert re.fullmatch(r"(uffd 0: )?pthread_create\((controller|vCPU \d+ of 16|reader 0 of 1)\): "
                        r"Resource temporarily unavailable \(EAGAIN\)", out["message"]), out
    assert out["released"] and out["next"] is True
