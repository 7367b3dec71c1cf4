"""A host that lacks KVM or userfaultfd gets a HostUnsupportedError that says
what is missing and what to do, not a crash.

Each case builds the broken host for real, in a private mount namespace: a
tmpfs over /dev holding only the device nodes the case allows, and
capabilities dropped with setpriv. Needs root and util-linux.
"""
import json
import os
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


def run_in_broken_host(devices, drop_caps=()):
    """Runs PROBE with only `devices` in /dev and without `drop_caps`."""
    setup = ["mount -t tmpfs none /dev"]
    for name, (major, minor), mode in devices:
        setup.append(f"mknod -m {mode} /dev/{name} c {major} {minor}")
    cmd = [sys.executable, "-c", PROBE]
    if drop_caps:
        caps = ",".join(f"-{c}" for c in drop_caps)
        cmd = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"] + cmd
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
