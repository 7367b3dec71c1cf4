"""A host that lacks KVM or userfaultfd gets a HostUnsupportedError that says
what is missing and what to do, not a crash.

Each case builds the broken host for real, in a private mount namespace: a
tmpfs over /dev holding only the device nodes the case allows, and
capabilities dropped with setpriv. Needs root and util-linux.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.kvm

PROBE = """
import json, uffdkvm
try:
    r = uffdkvm.run(mem_per_vcpu="64K")
    print(json.dumps({"ok": r.verified}))
except uffdkvm.UffdkvmError as e:
    print(json.dumps({"error": type(e).__name__, "errno": e.errno, "message": str(e)}))
"""

needs_namespaces = pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")),
    reason="building a broken host needs root, unshare and setpriv")


def run_in_broken_host(devices, drop_caps=(), user=None, probe=PROBE):
    """Runs `probe` with only `devices` in /dev and without `drop_caps`, or
    as the unprivileged `user` (a uid, no supplementary groups). A device
    is (name, (major, minor), mode[, "uid:gid" owning it])."""
    setup = ["mount -t tmpfs none /dev"]
    for name, (major, minor), mode, *owner in devices:
        setup.append(f"mknod -m {mode} /dev/{name} c {major} {minor}")
        if owner:
            setup.append(f"chown {owner[0]} /dev/{name}")
    cmd = [sys.executable, "-c", probe]
    if drop_caps:
        caps = ",".join(f"-{c}" for c in drop_caps)
        cmd = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"] + cmd
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] + cmd
    script = " && ".join(setup) + " && exec " + " ".join(f"'{c}'" for c in cmd)
    p = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                       text=True, timeout=60, cwd="/")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


KVM = ("kvm", (10, 232), "666")
USERFAULTFD = ("userfaultfd", (10, 257), "666")


@needs_namespaces
def test_no_dev_kvm(kvm):
    out = run_in_broken_host([])
    assert out["error"] == "HostUnsupportedError"
    assert out["errno"] == 2
    assert out["message"].startswith("open(/dev/kvm): No such file or directory")
    assert "kvm_intel or kvm_amd" in out["message"]


@needs_namespaces
def test_dev_kvm_not_permitted(kvm):
    out = run_in_broken_host([("kvm", (10, 232), "000")],
                             drop_caps=("dac_override", "dac_read_search"))
    assert out["error"] == "HostUnsupportedError"
    assert out["errno"] == 13
    assert "read/write access to /dev/kvm" in out["message"]


@needs_namespaces
def test_userfaultfd_not_permitted(kvm):
    if open("/proc/sys/vm/unprivileged_userfaultfd").read().strip() != "0":
        pytest.skip("vm.unprivileged_userfaultfd=1 here: the syscall is open to everyone")
    out = run_in_broken_host([KVM], drop_caps=("sys_ptrace",))
    assert out["error"] == "HostUnsupportedError"
    assert out["errno"] == 1
    assert out["message"].startswith("userfaultfd(): Operation not permitted")
    assert "/dev/userfaultfd" in out["message"]


@needs_namespaces
def test_dev_userfaultfd_grants_what_the_syscall_refuses(kvm):
    """The least a non-root user needs: /dev/kvm and /dev/userfaultfd."""
    out = run_in_broken_host([KVM, USERFAULTFD], drop_caps=("sys_ptrace",))
    assert out == {"ok": True}


# ---- a real unprivileged user: what README's "Privileges" promises ----

NOBODY = 65534
KVM_GROUP = ("kvm", (10, 232), "660", f"0:{NOBODY}")     # rw for the user's group
USERFAULTFD_OWNED = ("userfaultfd", (10, 257), "600", f"{NOBODY}:0")


@pytest.fixture(scope="module")
def unprivileged():
    """Skips unless an unprivileged user can run this Python and import
    uffdkvm (a virtualenv under a private home directory cannot)."""
    p = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                        "--clear-groups", sys.executable, "-c", "import uffdkvm"],
                       capture_output=True, text=True, timeout=60, cwd="/")
    if p.returncode:
        pytest.skip(f"uid {NOBODY} cannot import uffdkvm from this Python: "
                    f"{p.stderr.strip().splitlines()[-1:]}")


def unprivileged_userfaultfd():
    with open("/proc/sys/vm/unprivileged_userfaultfd") as f:
        return f.read().strip() != "0"


@needs_namespaces
def test_a_user_with_kvm_and_dev_userfaultfd_runs(kvm, unprivileged):
    out = run_in_broken_host([KVM_GROUP, USERFAULTFD_OWNED], user=NOBODY)
    assert out == {"ok": True}


@needs_namespaces
def test_a_user_with_kvm_only_is_told_about_dev_userfaultfd(kvm, unprivileged):
    if unprivileged_userfaultfd():
        pytest.skip("vm.unprivileged_userfaultfd=1 here: the syscall is open to everyone")
    out = run_in_broken_host([KVM_GROUP], user=NOBODY)
    assert out["error"] == "HostUnsupportedError" and out["errno"] == 1
    assert "/dev/userfaultfd" in out["message"]
    assert "vm.unprivileged_userfaultfd=1" in out["message"]


@needs_namespaces
def test_a_user_without_access_to_dev_kvm_is_told(kvm, unprivileged):
    out = run_in_broken_host([("kvm", (10, 232), "600", "0:0"), USERFAULTFD_OWNED],
                             user=NOBODY)
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


@needs_namespaces
def test_huge_pages_reserved_by_root_serve_an_unprivileged_user(kvm, hugepages, unprivileged):
    """Reserving huge pages takes root, once; using them takes nothing."""
    with open("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages") as f:
        if int(f.read()) < 1:
            pytest.skip("no free 2 MiB huge page")
    out = run_in_broken_host([KVM_GROUP, USERFAULTFD_OWNED], user=NOBODY,
                             probe=HUGETLB_PROBE)
    assert out == {"anonymous_hugetlb": True, "shared_hugetlb": True, "reserve": 13}


NPROC_PROBE = """
import json, os, resource, time, uffdkvm

def counts():
    return [len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))]

resource.setrlimit(resource.RLIMIT_NPROC, (12, 12))  # threads count too
before, out = counts(), {}
try:
    uffdkvm.run(vcpus=16, mem_per_vcpu="64K", single_uffd=True)
    out["ok"] = True
except uffdkvm.UffdkvmError as e:
    out.update(error=type(e).__name__, errno=e.errno, message=str(e))
time.sleep(0.05)
out["released"] = counts() == before
out["next"] = uffdkvm.run(vcpus=4, mem_per_vcpu="64K", readers=2, single_uffd=True).verified
print(json.dumps(out))
"""


@needs_namespaces
def test_a_users_thread_limit_fails_the_run_naming_the_thread(kvm, unprivileged):
    """RLIMIT_NPROC (ulimit -u) counts threads: a run past it fails for real
    with EAGAIN from pthread_create, named, and gives back what it made."""
    out = run_in_broken_host([KVM_GROUP, USERFAULTFD_OWNED], user=NOBODY, probe=NPROC_PROBE)
    assert out["error"] == "RunError" and out["errno"] == 11, out
    assert re.fullmatch(r"(uffd 0: )?pthread_create\((controller|vCPU \d+ of 16|reader 0 of 1)\): "
                        r"Resource temporarily unavailable \(EAGAIN\)", out["message"]), out
    assert out["released"] and out["next"] is True
