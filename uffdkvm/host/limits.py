"""The limits that apply to this process: its cgroups' and RLIMIT_NPROC.

A container or a CI job rarely has the whole host: a memory cgroup that
is smaller than MemAvailable OOM-kills a run without a word, a hugetlb
cgroup refuses huge pages the pool has free, and a pids cgroup or
``ulimit -u`` refuses a thread. run() reads what is left under each of
them here before it builds anything (see run.py's ``_check_fits_host``).

Each controller's cgroup is found from /proc/self/cgroup and
/proc/self/mountinfo, cgroup v1 and v2 alike (and the hybrid of both, where
a controller is in v1 if a v1 hierarchy has it, else in v2); a cgroup
namespace, where the process's path is "/", is read at the mount point.
The limit that binds is the smallest room over the cgroup and its
ancestors up to the mount's root. A file that cannot be read means no limit
is known there, never an exception: a host without cgroups has no limits of
this kind.
"""
from __future__ import annotations

import os
import resource
from dataclasses import dataclass

# cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit
# value (PAGE_COUNTER_MAX pages); anything this large is no limit.
_V1_UNLIMITED = 1 << 62
# Capabilities under which the kernel does not enforce RLIMIT_NPROC
# (kernel/fork.c, copy_process: CAP_SYS_RESOURCE or CAP_SYS_ADMIN, or the
# root user of the initial user namespace).
_CAP_SYS_ADMIN = 21
_CAP_SYS_RESOURCE = 24


@dataclass(frozen=True)
class Limit:
    """One limit and what this process's cgroup (or user) has used of it.

    path: the file the limit was read from (for RLIMIT_NPROC, "RLIMIT_NPROC");
    limit: its value, in bytes (memory, hugetlb) or tasks (pids, nproc);
    used: what is charged against it now; room: limit less used, at least 0.
    """

    path: str
    limit: int
    used: int

    @property
    def room(self) -> int:
        return max(self.limit - self.used, 0)


@dataclass(frozen=True)
class _Hierarchy:
    version: int          # 1 or 2
    mount: str            # where it is mounted
    directory: str        # this process's cgroup in it


# Each controller's hierarchy and this process's cgroup in it (hierarchies()).
Hierarchies = dict[str, _Hierarchy]


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except (OSError, ValueError):
        return None


def _read_int(path: str) -> int | None:
    """A cgroup file's number; None when unreadable, "max" or unparsable."""
    text = _read(path)
    if text is None:
        return None
    text = text.strip()
    try:
        value = int(text.split()[0]) if text else None
    except ValueError:
        return None
    return value


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040).
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit() and len(field[i + 1:i + 4]) == 3:
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mounts(mountinfo: str) -> list[tuple[int, str, str, set[str]]]:
    """The cgroup mounts: (version, root within the hierarchy, mount point,
    v1 controllers)."""
    mounts: list[tuple[int, str, str, set[str]]] = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        fstype, options = tail[0], tail[2].split(",")
        if fstype == "cgroup2":
            mounts.append((2, _unescape(fields[3]), _unescape(fields[4]), set()))
        elif fstype == "cgroup":
            names = {o for o in options if o not in ("rw", "ro") and "=" not in o}
            names |= {o for o in options if o.startswith("name=")}
            mounts.append((1, _unescape(fields[3]), _unescape(fields[4]), names))
    return mounts


# How many cgroups _find_self() looks through at most.
_SEARCH_MAX = 10000


def _find_self(mount: str) -> str | None:
    """The cgroup under mount whose cgroup.procs lists this process: for a
    cgroup namespace whose root the mount does not show (mountinfo's root
    is then "/.." or the like, /proc/self/cgroup's path relative to a
    cgroup it does not name)."""
    pid, seen = str(os.getpid()), 0
    for directory, _, _ in os.walk(mount):
        seen += 1
        if seen > _SEARCH_MAX:
            return None
        if pid in (_read(os.path.join(directory, "cgroup.procs")) or "").split():
            return directory
    return None


def _directory(mount: str, root: str, path: str) -> str | None:
    """Where the cgroup at path (as /proc/self/cgroup gives it) is under a
    mount whose root within the hierarchy is root: a cgroup namespace or a
    container's bind mount shows the process at "/" or below the mount's
    root; a mount of a hierarchy outside the namespace is searched."""
    if root.startswith("/.."):
        return _find_self(mount)
    root = root.rstrip("/")
    if path == root or path.startswith(root + "/"):
        rel = path[len(root):]
    elif root:
        return None       # outside what this mount shows
    else:
        rel = path
    directory = os.path.normpath(mount + "/" + rel.lstrip("/"))
    return directory if os.path.isdir(directory) else None


def hierarchies(proc_cgroup: str | None = None,
                mountinfo: str | None = None) -> Hierarchies:
    """Each controller's hierarchy and this process's cgroup in it, by
    controller name ("memory", "pids", "hugetlb", ...). A controller of a
    v1 hierarchy is read there; the others are v2's, if it is mounted."""
    proc_cgroup = _read("/proc/self/cgroup") if proc_cgroup is None else proc_cgroup
    mountinfo = _read("/proc/self/mountinfo") if mountinfo is None else mountinfo
    if not proc_cgroup or not mountinfo:
        return {}
    mounts = _mounts(mountinfo)
    found: dict[str, _Hierarchy] = {}
    v2: _Hierarchy | None = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, names, path = parts
        if names == "":
            for version, root, point, _ in mounts:
                d = _directory(point, root, path) if version == 2 else None
                if d:
                    v2 = _Hierarchy(2, point, d)
                    break
            continue
        wanted = set(names.split(","))
        for version, root, point, options in mounts:
            if version == 1 and wanted & options:
                d = _directory(point, root, path)
                if d:
                    for name in wanted:
                        found.setdefault(name, _Hierarchy(1, point, d))
                    break
    if v2 is not None:
        # A v2 controller is only where the v1 hierarchies do not have it.
        controllers = (_read(os.path.join(v2.mount, "cgroup.controllers")) or "").split()
        for name in controllers:
            found.setdefault(name, v2)
    return found


def _levels(h: _Hierarchy) -> list[str]:
    """The cgroup and its ancestors, up to the mount point."""
    out, d = [], h.directory
    while True:
        out.append(d)
        if d == h.mount or len(d) <= len(h.mount):
            return out
        d = os.path.dirname(d)


def _tightest(limits: list[Limit]) -> Limit | None:
    return min(limits, key=lambda lim: lim.room) if limits else None


# The page cache in memory.stat, active and inactive, and of it what is dirty
# or under writeback: v1's hierarchical totals (this cgroup and those below
# it, as memory.usage_in_bytes counts them), v2's (always hierarchical).
_FILE_CACHE = {
    1: (("total_active_file", "total_inactive_file"), ("total_dirty", "total_writeback")),
    2: (("active_file", "inactive_file"), ("file_dirty", "file_writeback")),
}


def _reclaimable_file(directory: str, version: int) -> int:
    """Page cache the kernel reclaims before it fails a charge: all of it,
    active or inactive (reclaim deactivates active pages and takes them
    too), less what is dirty or under writeback, which can be taken only
    once written, and a charge at the limit waits for that or fails (the
    reclaim a charge does writes no file pages itself). Counting those
    as used may refuse a run that a flush would let fit; leaving them out
    could let one start that the kernel then kills."""
    cache, unclean = _FILE_CACHE[version]
    values = {}
    for line in (_read(os.path.join(directory, "memory.stat")) or "").splitlines():
        name, _, value = line.partition(" ")
        try:
            values[name] = int(value)
        except ValueError:
            pass
    return max(sum(values.get(k, 0) for k in cache) - sum(values.get(k, 0) for k in unclean), 0)


def memory(found: Hierarchies | None = None) -> Limit | None:
    """The memory cgroup limit with the least room: v1 memory.limit_in_bytes
    less memory.usage_in_bytes, v2 memory.max and memory.high less
    memory.current (reclaimable page cache left out of the usage); None
    when no limit is set or none can be read."""
    h = (hierarchies() if found is None else found).get("memory")
    if h is None:
        return None
    files: tuple[str, ...]
    if h.version == 1:
        files, usage_file = ("memory.limit_in_bytes",), "memory.usage_in_bytes"
    else:
        files, usage_file = ("memory.max", "memory.high"), "memory.current"
    limits = []
    for d in _levels(h):
        usage = _read_int(os.path.join(d, usage_file))
        for name in files:
            value = _read_int(os.path.join(d, name))
            if value is None or value >= _V1_UNLIMITED or usage is None:
                continue
            used = max(usage - _reclaimable_file(d, h.version), 0)
            limits.append(Limit(os.path.join(d, name), value, used))
    return _tightest(limits)


def _hugetlb_size_name(page_bytes: int) -> str:
    # The kernel's names: hugetlb.2MB.*, hugetlb.1GB.* (mm/hugetlb_cgroup.c).
    if page_bytes >= 1 << 30:
        return f"{page_bytes >> 30}GB"
    if page_bytes >= 1 << 20:
        return f"{page_bytes >> 20}MB"
    return f"{page_bytes >> 10}KB"


def hugetlb(page_bytes: int, found: Hierarchies | None = None) -> Limit | None:
    """The hugetlb cgroup limit on pages of page_bytes with the least room:
    v1 hugetlb.<size>.limit_in_bytes less usage_in_bytes; v2 hugetlb.<size>.max
    less .current, and the reservations' hugetlb.<size>.rsvd.max less
    .rsvd.current; None when none is set or none can be read."""
    h = (hierarchies() if found is None else found).get("hugetlb")
    if h is None:
        return None
    size = _hugetlb_size_name(page_bytes)
    if h.version == 1:
        pairs = [(f"hugetlb.{size}.limit_in_bytes", f"hugetlb.{size}.usage_in_bytes"),
                 (f"hugetlb.{size}.rsvd.limit_in_bytes", f"hugetlb.{size}.rsvd.usage_in_bytes")]
    else:
        pairs = [(f"hugetlb.{size}.max", f"hugetlb.{size}.current"),
                 (f"hugetlb.{size}.rsvd.max", f"hugetlb.{size}.rsvd.current")]
    limits = []
    for d in _levels(h):
        for limit_name, usage_name in pairs:
            value = _read_int(os.path.join(d, limit_name))
            used = _read_int(os.path.join(d, usage_name))
            if value is None or used is None or value >= _V1_UNLIMITED:
                continue
            limits.append(Limit(os.path.join(d, limit_name), value, used))
    return _tightest(limits)


def pids(found: Hierarchies | None = None) -> Limit | None:
    """The pids cgroup limit with the least room (pids.max less pids.current,
    which count threads); None when none is set or none can be read."""
    h = (hierarchies() if found is None else found).get("pids")
    if h is None:
        return None
    limits = []
    for d in _levels(h):
        value = _read_int(os.path.join(d, "pids.max"))
        used = _read_int(os.path.join(d, "pids.current"))
        if value is not None and used is not None:
            limits.append(Limit(os.path.join(d, "pids.max"), value, used))
    return _tightest(limits)


def _effective_caps(status: str | None = None) -> int | None:
    status = _read("/proc/self/status") if status is None else status
    for line in (status or "").splitlines():
        if line.startswith("CapEff:"):
            try:
                return int(line.split()[1], 16)
            except (IndexError, ValueError):
                return None
    return None


def _tasks_of_user(uid: int) -> int | None:
    """Threads whose real uid is uid, as far as this process can see them:
    what the kernel counts against RLIMIT_NPROC."""
    n = 0
    try:
        pids_ = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids_:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
            owner = _read(f"/proc/{pid}/status")
        except OSError:
            continue
        for line in (owner or "").splitlines():
            if line.startswith("Uid:"):
                if int(line.split()[1]) == uid:
                    n += len(tids)
                break
    return n


def nproc_enforced(status: str | None = None, uid: int | None = None) -> bool:
    """Whether the kernel holds this process to RLIMIT_NPROC: not for the
    root user, nor with CAP_SYS_ADMIN or CAP_SYS_RESOURCE in effect.

    Both are read as this process sees them, but the kernel (copy_process)
    exempts only the initial user namespace's root and capable(), which
    asks of the initial namespace: inside a user namespace (a rootless
    container) uid 0 or those capabilities in CapEff do not exempt the
    process, and this says False where the kernel enforces the limit. The
    check before a run then misses it (a thread refused mid-run fails the
    run with a RunError naming the thread); it never refuses a run that
    fits."""
    if (os.getuid() if uid is None else uid) == 0:
        return False
    caps = _effective_caps(status)
    if caps is None:
        return True
    return not caps & (1 << _CAP_SYS_ADMIN | 1 << _CAP_SYS_RESOURCE)


def nproc() -> Limit | None:
    """RLIMIT_NPROC (``ulimit -u``) against this user's threads, where the
    kernel enforces it; None where it does not or the limit is infinite."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    except (OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY or not nproc_enforced():
        return None
    used = _tasks_of_user(os.getuid())
    return None if used is None else Limit("RLIMIT_NPROC", soft, used)
