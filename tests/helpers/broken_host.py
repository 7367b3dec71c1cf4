"""Hosts that lack KVM or userfaultfd, built for real for the tests that
need one: a private mount namespace (unshare -m) with a tmpfs over /dev that
holds only the device nodes a case allows, capabilities dropped with
setpriv, or an unprivileged user (uid 65534, no supplementary groups).
Needs root and util-linux.

The process inside runs this Python on the uffdkvm that this session
imported, whatever the install: Stage copies the package (the built
extension included) to a directory every user can read and points
PYTHONPATH at it, and where the interpreter lives under a directory the
unprivileged user cannot enter (pyenv under /root, mode 0700), the namespace
lays a tmpfs over that directory and binds the interpreter's own tree back
at the same path, so nothing else of it shows.
"""
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import uffdkvm
from uffdkvm._spawn import HAVE_SAFE_PATH
from .hostfacts import NO_DEV_USERFAULTFD, NOT_ROOT, host_skip, misc_device, missing_tool

NOBODY = 65534

# Device nodes: (name, (major, minor), mode[, "uid:gid" owning it]). KVM's
# minor is fixed (KVM_MINOR, include/linux/miscdevice.h); userfaultfd's is
# dynamic, whatever this kernel gave it (None where it has no such device).
KVM_DEV = (10, 232)
USERFAULTFD_DEV = misc_device("userfaultfd")
KVM = ("kvm", KVM_DEV, "666")
USERFAULTFD = ("userfaultfd", USERFAULTFD_DEV, "666")
KVM_GROUP = ("kvm", KVM_DEV, "660", f"0:{NOBODY}")     # rw for the user's group
KVM_ROOT_ONLY = ("kvm", KVM_DEV, "600", "0:0")
USERFAULTFD_OWNED = ("userfaultfd", USERFAULTFD_DEV, "600", f"{NOBODY}:0")

NAMESPACE_FACTS = (NOT_ROOT, missing_tool("unshare"), missing_tool("setpriv"))


def skip_unless_namespaces():
    """Skips, citing the facts, where broken hosts cannot be built."""
    __tracebackhide__ = True
    if any(f.holds for f in NAMESPACE_FACTS):
        host_skip(NAMESPACE_FACTS, "building a broken host needs root, unshare and setpriv")


def _enterable(path, uid=NOBODY, gid=NOBODY):
    """May uid (in group gid) search directory `path`? Mode bits only."""
    st = os.stat(path)
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _first_closed_ancestor(path):
    """The outermost directory above `path` that uid NOBODY cannot enter."""
    for parent in reversed(Path(path).parents):
        if not _enterable(parent):
            return parent
    return None


class Stage:
    """A directory every user can read, holding this session's uffdkvm and
    any extra files, and the mounts that show this interpreter to NOBODY."""

    def __init__(self, extra_files=()):
        # The temporary directory ($TMPDIR, else /tmp), not pytest's (mode 0700).
        self.dir = Path(tempfile.mkdtemp(prefix="uffdkvm-stage-"))
        self.pythonpath = self.dir / "pkg"
        package = Path(uffdkvm.__file__).resolve().parent
        shutil.copytree(package, self.pythonpath / "uffdkvm",
                        ignore=shutil.ignore_patterns("__pycache__"))
        self.files = {}
        for src in extra_files:
            dst = self.dir / Path(src).name
            shutil.copy2(src, dst)
            self.files[Path(src).name] = dst
        for root, dirs, files in os.walk(self.dir):
            os.chmod(root, 0o755)
            for name in files:
                p = os.path.join(root, name)
                os.chmod(p, os.stat(p).st_mode | 0o444)
        self._expose = self._interpreter_mounts()

    def _interpreter_mounts(self):
        """Shell steps, run as root in the namespace, after which NOBODY can
        run sys.executable from its usual path."""
        trees = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(),
                 Path(sys.executable).resolve().parent}
        # A tree inside another comes with it.
        trees = sorted(t for t in trees if not any(o != t and o in t.parents for o in trees))
        hidden = []  # (tree, the closed directory above it)
        for tree in trees:
            closed = _first_closed_ancestor(tree)
            if closed is not None:
                hidden.append((tree, closed))
        if not hidden:
            return []
        saves, covers, binds = [], [], []
        for i, (tree, closed) in enumerate(hidden):
            keep = self.dir / "keep" / str(i)
            keep.mkdir(parents=True)
            saves.append(f"mount --bind {shlex.quote(str(tree))} {shlex.quote(str(keep))}")
            binds.append(f"mkdir -p {shlex.quote(str(tree))} && "
                         f"mount --bind {shlex.quote(str(keep))} {shlex.quote(str(tree))}")
        # Outermost first: a tmpfs over a directory hides the ones below it.
        closed_dirs = sorted({c for _, c in hidden}, key=lambda p: len(p.parts))
        for c in closed_dirs:
            if not any(o in c.parents for o in closed_dirs):
                covers.append(f"mount -t tmpfs -o mode=0755 none {shlex.quote(str(c))}")
        return saves + covers + binds

    def python(self, *args):
        """This interpreter on the staged uffdkvm only (-S: no site-packages,
        where an editable install might point elsewhere; -P where it has it:
        nothing from the working directory, as uffdkvm._spawn says, though
        run() starts it in /)."""
        return [sys.executable, "-S", *(["-P"] if HAVE_SAFE_PATH else []), *args]

    def env(self, **extra):
        env = dict(os.environ, PYTHONPATH=str(self.pythonpath))
        env.update(extra)
        return env

    def run(self, devices, argv, drop_caps=(), user=None, env=None, timeout=60):
        """Runs argv in a broken host: only `devices` in /dev, without
        `drop_caps`, or as the unprivileged `user` (a uid, no supplementary
        groups). Returns the CompletedProcess."""
        __tracebackhide__ = True
        if any(name == "userfaultfd" for name, *_ in devices) and USERFAULTFD_DEV is None:
            host_skip(NO_DEV_USERFAULTFD, "the case gives the process /dev/userfaultfd")
        setup = list(self._expose) if user is not None else []
        setup.append("mount -t tmpfs none /dev")
        for name, (major, minor), mode, *owner in devices:
            setup.append(f"mknod -m {mode} /dev/{name} c {major} {minor}")
            if owner:
                setup.append(f"chown {owner[0]} /dev/{name}")
        cmd = list(argv)
        if drop_caps:
            caps = ",".join(f"-{c}" for c in drop_caps)
            cmd = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"] + cmd
        if user is not None:
            cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] + cmd
        script = " && ".join(setup) + " && exec " + " ".join(shlex.quote(c) for c in cmd)
        return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                              text=True, timeout=timeout, cwd="/", env=env or self.env())

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)
