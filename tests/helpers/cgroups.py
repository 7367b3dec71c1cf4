"""Real cgroups for the tests: made, limited, entered by a child, removed.

``Cgroup("memory")`` makes /sys/fs/cgroup/memory/uffdkvm-test-XXXX in the
cgroup v1 hierarchy of that controller; ``Cgroup("hugetlb", version=2)`` a
leaf uffdkvm-test-XXXX/run in the v2 hierarchy, below a parent that turns
the controller on for its children (cgroup.subtree_control: a v2 cgroup
with processes may not hand controllers down). A child process joins by
writing its own pid to cgroup.procs (``join_code``) before it runs the
experiment, so only the child is limited; the cgroup is removed on every
way out, its processes killed first.
"""
from __future__ import annotations

import os
import secrets
import signal
import time

V1_ROOT = "/sys/fs/cgroup"
V2_ROOT = "/sys/fs/cgroup/unified"


def v1_mounted(controller):
    """The v1 hierarchy of controller, or None."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            tail = right.split()
            if len(tail) >= 3 and tail[0] == "cgroup" and controller in tail[2].split(","):
                return left.split()[4]
    return None


def v2_available(controller):
    """The v2 mount point if it offers controller, or None."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split()[:1] == ["cgroup2"]:
                point = left.split()[4]
                try:
                    with open(os.path.join(point, "cgroup.controllers")) as g:
                        if controller in g.read().split():
                            return point
                except OSError:
                    return None
    return None


class Cgroup:
    def __init__(self, controller, version=1):
        self.controller, self.version = controller, version
        self._made = []
        self._enabled_at_root = None
        try:
            self._make(f"uffdkvm-test-{secrets.token_hex(4)}")
        except BaseException:
            self.remove()  # what was made before the failure
            raise

    def _make(self, name):
        controller, version = self.controller, self.version
        if version == 1:
            root = v1_mounted(controller)
            if root is None:
                raise OSError(f"no cgroup v1 hierarchy has {controller}")
            self.path = os.path.join(root, name)
            self._mkdir(self.path)
        else:
            root = v2_available(controller)
            if root is None:
                raise OSError(f"the cgroup v2 hierarchy does not offer {controller}")
            # The root hands the controller down too (it may, with processes in it).
            with open(os.path.join(root, "cgroup.subtree_control")) as f:
                if controller not in f.read().split():
                    self.write_at(root, "cgroup.subtree_control", f"+{controller}")
                    self._enabled_at_root = root
            parent = os.path.join(root, name)
            self._mkdir(parent)
            self.write_at(parent, "cgroup.subtree_control", f"+{controller}")
            self.path = os.path.join(parent, "run")
            self._mkdir(self.path)

    def _mkdir(self, path):
        os.mkdir(path)
        self._made.append(path)

    @staticmethod
    def write_at(directory, name, value):
        with open(os.path.join(directory, name), "w") as f:
            f.write(str(value))

    def write(self, name, value):
        self.write_at(self.path, name, value)

    def read(self, name):
        with open(os.path.join(self.path, name)) as f:
            return f.read().strip()

    def procs(self):
        return [int(p) for p in self.read("cgroup.procs").split()]

    def join_code(self):
        """Python source that moves the process running it into this cgroup."""
        return (f"with open({os.path.join(self.path, 'cgroup.procs')!r}, 'w') as _f:\n"
                f"    _f.write(str(__import__('os').getpid()))\n")

    def remove(self):
        deadline = time.monotonic() + 10
        for path in reversed(self._made):
            while os.path.isdir(path):
                try:
                    os.rmdir(path)
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    self._kill(path)
                    time.sleep(0.05)
        self._made = []
        if self._enabled_at_root:
            try:  # as it was, unless another cgroup below uses it now (EBUSY)
                self.write_at(self._enabled_at_root, "cgroup.subtree_control",
                              f"-{self.controller}")
            except OSError:
                pass
            self._enabled_at_root = None

    @staticmethod
    def _kill(path):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
