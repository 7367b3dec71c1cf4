"""Debian's own kernels: fetched as packages with an apt of uffdkvm's own,
unpacked, never installed.

Each name tracks something Debian moves: a metapackage of a suite
(bookworm's linux-image-amd64 is its 6.1) or the newest release of a series
in a suite (trixie-backports' newest 6.18), so that the same name gives the
newest build each time the lists are refreshed (once a day). A name whose
suite no longer carries what it tracks is a KernelUnavailableError that says
so: it never passes as tested.

apt runs with a configuration of its own per suite under the cache
directory: its own sources.list, an empty SourceParts and Preferences (so
that none of the host's deb822 sources or pins leak in), its own lists,
status and archives. Packages are verified with the host's Debian archive
keyring. An image package may be whole (6.1, 6.12, 6.18) or a small
metapackage over linux-binary-* (the kernel, in usr/lib/modules/RELEASE)
and linux-modules-* (7.2 on): every part is unpacked into one tree, whose
usr/lib/modules is linked from lib/modules, where kmod's `depmod -b` and
`modprobe -d` look.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator

from ._kernel import Kernel, KernelUnavailableError, image_release

DEFAULT_ARCHIVE = "http://deb.debian.org"
KEYRING = pathlib.Path("/usr/share/keyrings/debian-archive-keyring.gpg")
# Lists older than this are refreshed before a name is resolved.
LISTS_MAX_AGE_S = 24 * 3600
# One fetch (downloads, unpacking, depmod) at a time per cache; another waits this long.
LOCK_TIMEOUT_S = 1800


class KernelWarning(UserWarning):
    """A Debian kernel taken from the cache because the archive could not be
    asked for its newest build (the message says which and when)."""


@dataclasses.dataclass(frozen=True)
class Track:
    """What a name follows: a suite, and in it a metapackage's image
    package or the newest image of a series (``series``: "6.18")."""
    suite: str
    metapackage: str | None = None
    series: str | None = None
    about: str = ""

    def __str__(self) -> str:
        what = self.metapackage or f"the newest {self.series}"
        return f"{what} in {self.suite}"


# What apt is given for each suite: (the archive's path, a suite) pairs.
# Debian 12's kernels are updated in bookworm-security first.
SUITES = {
    "bookworm": [("debian", "bookworm"), ("debian", "bookworm-updates"),
                 ("debian-security", "bookworm-security")],
    "trixie-backports": [("debian", "trixie-backports")],
    "sid": [("debian", "sid")],
}

#: Debian's kernels by the names uffdkvm gives them.
DEBIAN_KERNELS = {
    "6.1": Track("bookworm", metapackage="linux-image-amd64",
                 about="Debian 12's kernel"),
    "6.12": Track("bookworm", metapackage="linux-image-6.12-amd64",
                  about="Debian 13's kernel, as Debian 12 offers it"),
    "6.18": Track("trixie-backports", series="6.18",
                  about="the newest 6.18 backported to Debian 13"),
    "7.2": Track("sid", series="7.2", about="the newest 7.2 in unstable"),
    "backports": Track("trixie-backports", metapackage="linux-image-amd64",
                       about="the newest kernel backported to Debian 13"),
    "sid": Track("sid", metapackage="linux-image-amd64",
                 about="the newest kernel in unstable"),
}

# An amd64 image package of a release (not cloud-, rt-, -dbg or unsigned):
# linux-image-6.1.0-57-amd64, linux-image-6.18.15+deb13-amd64.
_IMAGE = re.compile(r"^linux-image-(?P<release>\d+\.\d+(?:\.\d+)?(?:-\d+|\+deb\d+)?)-amd64$")


def archive() -> str:
    """Debian's archive, or the mirror UFFDKVM_DEBIAN_MIRROR names."""
    return os.environ.get("UFFDKVM_DEBIAN_MIRROR", DEFAULT_ARCHIVE).rstrip("/")


def cache_dir() -> pathlib.Path:
    """Where kernels are kept between runs (UFFDKVM_KERNEL_CACHE)."""
    default = pathlib.Path.home() / ".cache" / "uffdkvm" / "kernels"
    return pathlib.Path(os.environ.get("UFFDKVM_KERNEL_CACHE", default))


def _run(argv: list[str], cwd: pathlib.Path | None = None, timeout: float = 900,
         merged: bool = False) -> str:
    """argv's output (with its stderr after it when merged); RuntimeError
    with what it said when it fails."""
    try:
        p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise KernelUnavailableError(f"{argv[0]} is not installed: Debian's kernels are "
                                     f"fetched with apt and unpacked with dpkg-deb and "
                                     f"kmod (apt-get install apt dpkg kmod)") from None
    except subprocess.TimeoutExpired:
        raise KernelUnavailableError(f"{' '.join(argv[:3])} ... took over {timeout:.0f} s") \
            from None
    if p.returncode:
        shown = [w for i, w in enumerate(argv) if w != "-o" and argv[i - 1] != "-o"]
        raise RuntimeError(f"{' '.join(shown)} exited {p.returncode}: "
                           f"{(p.stderr or p.stdout).strip()[-1500:]}")
    return p.stdout + p.stderr if merged else p.stdout


class _Apt:
    """apt-get and apt-cache on one suite, with a configuration of their own."""

    def __init__(self, suite: str):
        self.suite = suite
        self.root = cache_dir() / "apt" / suite
        etc = self.root / "etc"
        # The host's apt.conf applies (its proxy, its mirror's quirks: this
        # kind of machine's mirror serves sid with an expired Valid-Until,
        # which its apt.conf.d accepts), but never its sources or pins, and
        # the -o options, applied last (apt.conf(5)), keep every package
        # signed whatever the host allows.
        self.options = [
            "-o", f"Dir::Etc::SourceList={etc / 'sources.list'}",
            "-o", f"Dir::Etc::SourceParts={etc / 'sources.list.d'}",
            "-o", f"Dir::Etc::Preferences={etc / 'preferences'}",
            "-o", f"Dir::Etc::PreferencesParts={etc / 'preferences.d'}",
            "-o", f"Dir::State={self.root / 'state'}",
            "-o", f"Dir::State::status={self.root / 'state' / 'status'}",
            "-o", f"Dir::Cache={self.root / 'cache'}",
            "-o", "APT::Architecture=amd64", "-o", "APT::Architectures=amd64",
            "-o", "Acquire::Languages=none",
            "-o", "Acquire::AllowInsecureRepositories=false",
            "-o", "Acquire::AllowDowngradeToInsecureRepositories=false",
            "-o", "APT::Get::AllowUnauthenticated=false",
        ]
        for d in ("etc/sources.list.d", "etc/preferences.d", "state/lists/partial",
                  "cache/archives/partial"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        sources = "".join(f"deb [signed-by={KEYRING}] {archive()}/{path} {name} main\n"
                          for path, name in SUITES[suite])
        (etc / "sources.list").write_text(sources)
        # Lists fetched for other sources (an older uffdkvm's, another
        # mirror's) are stale whatever their age.
        self.updated_for = self.root / "state" / "updated-for"
        self.stale = not self.updated_for.exists() or self.updated_for.read_text() != sources
        (etc / "preferences").touch()
        (self.root / "state" / "status").touch()

    def _lists(self) -> list[pathlib.Path]:
        return list((self.root / "state" / "lists").glob("*_Packages*"))

    def update(self, force: bool = False) -> None:
        # Aged by when they were fetched (the stamp written below): apt gives
        # each list file the archive's Last-Modified, often weeks old.
        if self._lists() and not force and not self.stale and \
                time.time() - self.updated_for.stat().st_mtime < LISTS_MAX_AGE_S:
            return
        if not KEYRING.exists():
            raise KernelUnavailableError(f"no {KEYRING}: apt-get install debian-archive-keyring")
        try:
            said = _run(["apt-get", *self.options, "-q", "update"], merged=True)
        except RuntimeError as e:
            raise KernelUnavailableError(f"the {self.suite} suite's package lists could not "
                                         f"be fetched from {archive()}: {e}") from None
        if not self._lists():
            # apt-get update exits 0 when it fetched nothing: its warnings say why.
            why = [ln.strip() for ln in said.splitlines() if ln.startswith(("W:", "E:", "Err"))]
            raise KernelUnavailableError(f"apt-get update fetched no package list for "
                                         f"{self.suite} from {archive()}: "
                                         f"{' '.join(why[-2:]) or 'it said nothing'}")
        self.updated_for.write_text((self.root / "etc" / "sources.list").read_text())
        self.stale = False

    def cache(self, *args: str) -> str:
        return _run(["apt-cache", *self.options, *args])

    def depends(self, package: str) -> list[str]:
        out = []
        for line in self.cache("depends", package).splitlines():
            kind, _, dep = line.strip().partition(":")
            if kind == "Depends":
                out.append(dep.strip())
        return out

    def version(self, package: str) -> str:
        """The version of ``package`` apt would take today."""
        for line in self.cache("show", "--no-all-versions", package).splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
        raise KernelUnavailableError(f"apt-cache show {package} gives no version")

    def download(self, packages: list[str], into: pathlib.Path) -> None:
        _run(["apt-get", *self.options, "-q", "download", *packages], cwd=into)


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", release))


def image_package(apt: _Apt, track: Track) -> str:
    """The image package ``track`` names in its suite today."""
    if track.metapackage is not None:
        for dep in apt.depends(track.metapackage):
            if _IMAGE.match(dep):
                return dep
        raise KernelUnavailableError(f"{track.metapackage} in {track.suite} depends on no "
                                     f"linux-image package for amd64")
    found = [m for name in apt.cache("pkgnames", f"linux-image-{track.series}.").split()
             if (m := _IMAGE.match(name)) and
             re.fullmatch(re.escape(track.series or "") + r"\.\d+.*", m["release"])]
    if not found:
        raise KernelUnavailableError(f"{track.suite} has no {track.series} kernel for amd64 "
                                     f"any more: Debian has moved on (its newest: "
                                     f"{newest_in(apt) or 'none'})")
    return max(found, key=lambda m: _release_key(m["release"])).group(0)


def newest_in(apt: _Apt) -> str | None:
    names = [m for name in apt.cache("pkgnames", "linux-image-").split()
             if (m := _IMAGE.match(name))]
    return max(names, key=lambda m: _release_key(m["release"]))["release"] if names else None


def parts_of(apt: _Apt, package: str) -> list[str]:
    """The packages that make up an image: itself, and where it is a
    metapackage those of its release that hold the kernel (linux-binary),
    its modules (linux-modules) and the list of what is built in
    (linux-base: modules.builtin, without which modprobe takes a built-in
    module for a missing one)."""
    suffix = package.removeprefix("linux-image-")
    parts = {f"linux-{kind}-{suffix}" for kind in ("binary", "modules", "base")}
    return [package] + [dep.split()[0] for dep in apt.depends(package)
                        if dep.split()[0] in parts]


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
    """One fetch at a time per cache (matrix targets fetch side by side)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise KernelUnavailableError(
                        f"another process has held {path} for over {LOCK_TIMEOUT_S:.0f} s "
                        f"(fetching a kernel); try again once it is done") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _deb_name(package: str, version: str) -> str:
    """The file name apt-get download gives a package (an epoch's colon as %3a)."""
    return f"{package}_{version.replace(':', '%3a')}_amd64.deb"


def _unpack(apt: _Apt, packages: dict[str, str], root: pathlib.Path) -> None:
    """Downloads the packages (name: version) not yet in the cache and
    unpacks them all into root."""
    debs = cache_dir() / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    wanted = [p for p, v in packages.items() if not (debs / _deb_name(p, v)).exists()]
    if wanted:
        # Into a directory of its own first: an interrupted download must not
        # leave a .deb that a later run takes for whole.
        with tempfile.TemporaryDirectory(dir=debs) as part:
            try:
                apt.download(wanted, pathlib.Path(part))
            except RuntimeError:  # lists older than the archive: once more, refreshed
                apt.update(force=True)
                try:
                    apt.download(wanted, pathlib.Path(part))
                except RuntimeError as e:
                    raise KernelUnavailableError(f"{', '.join(wanted)} could not be "
                                                 f"downloaded: {e}") from None
            for done in pathlib.Path(part).glob("*.deb"):
                done.rename(debs / done.name)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for p, v in packages.items():
        deb = debs / _deb_name(p, v)
        if not deb.exists():
            raise KernelUnavailableError(f"apt-get download gave no {deb.name}")
        _run(["dpkg-deb", "-x", str(deb), str(root)])
    # 7.2's packages put modules (and the kernel) under usr/lib/modules only.
    if not (root / "lib" / "modules").exists() and (root / "usr/lib/modules").exists():
        (root / "lib").mkdir(exist_ok=True)
        (root / "lib" / "modules").symlink_to("../usr/lib/modules")


def _release_of(root: pathlib.Path) -> str:
    found = os.listdir(root / "lib" / "modules")
    if len(found) != 1:
        raise KernelUnavailableError(f"{root}/lib/modules holds {sorted(found)}, not one "
                                     f"release")
    return found[0]


def _image_of(root: pathlib.Path, release: str) -> pathlib.Path:
    for path in (root / "boot" / f"vmlinuz-{release}",
                 root / "lib" / "modules" / release / "vmlinuz"):
        if path.exists():
            return path
    raise KernelUnavailableError(f"the packages unpacked in {root} hold no vmlinuz for "
                                 f"{release} (boot/ or lib/modules/{release}/)")


def fetch(name: str) -> Kernel:
    """The Debian kernel ``name`` (a key of DEBIAN_KERNELS), downloaded and
    unpacked once, its module index built. KernelUnavailableError, saying
    why, where it cannot be had."""
    if name not in DEBIAN_KERNELS:
        raise KernelUnavailableError(f"no Debian kernel is called {name!r}: the names are "
                                     f"{', '.join(DEBIAN_KERNELS)}")
    track = DEBIAN_KERNELS[name]
    try:
        return _fetch(name, track)
    except (KernelUnavailableError, RuntimeError, OSError) as e:
        # apt's and dpkg's failures (RuntimeError from _run) and the cache's
        # (OSError); anything else is a bug here, not an unavailable kernel.
        raise KernelUnavailableError(f"Debian kernel {name} ({track}) is unavailable: "
                                     f"{e}") from None


def _fetch(name: str, track: Track) -> Kernel:
    resolved = cache_dir() / "resolved" / f"{name}.json"
    with _locked(cache_dir() / ".lock"):
        apt = _Apt(track.suite)
        try:
            apt.update()
        except KernelUnavailableError as e:
            # Offline: the build this name gave last, if it is still here.
            kernel = _last(name, track, resolved)
            if kernel is None:
                raise
            warnings.warn(f"Debian kernel {name}: {e}; taking the build it gave on "
                          f"{json.loads(resolved.read_text())['date']}, {kernel.origin}",
                          KernelWarning, stacklevel=3)
            return kernel
        # Lists no newer than this name's last answer give the same answer:
        # taken as it is, without a second of apt-cache.
        if resolved.exists() and resolved.stat().st_mtime >= apt.updated_for.stat().st_mtime:
            kernel = _last(name, track, resolved)
            if kernel is not None:
                return kernel
        package = image_package(apt, track)
        version = apt.version(package)
        # Keyed by version too: Debian rebuilds a release under the same name.
        root = cache_dir() / _deb_name(package, version).removesuffix("_amd64.deb")
        if not (root / ".unpacked").exists():
            _unpack(apt, {p: apt.version(p) for p in parts_of(apt, package)}, root)
            _run(["depmod", "-b", str(root), _release_of(root)])
            (root / ".unpacked").touch()
        resolved.parent.mkdir(exist_ok=True)
        resolved.write_text(json.dumps({"track": str(track), "package": package,
                                        "version": version, "root": str(root),
                                        "date": datetime.date.today().isoformat()}))
    return _kernel_in(name, track, root, package, version)


def fetched(name: str) -> Kernel | None:
    """The build the Debian name ``name`` gave when last fetched, if it is
    still in the cache; None if never (nothing is fetched to find out)."""
    track = DEBIAN_KERNELS[name]
    try:
        return _last(name, track, cache_dir() / "resolved" / f"{name}.json")
    except KernelUnavailableError:
        return None


def _last(name: str, track: Track, resolved: pathlib.Path) -> Kernel | None:
    try:
        last = json.loads(resolved.read_text())
        root = pathlib.Path(last["root"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    # What another track gave (the name now follows another suite or series) is not this one's.
    if last.get("track") != str(track) or not (root / ".unpacked").exists():
        return None
    return _kernel_in(name, track, root, last["package"], last["version"])


def _kernel_in(name: str, track: Track, root: pathlib.Path, package: str,
               version: str) -> Kernel:
    release = _release_of(root)
    image = _image_of(root, release)
    if image_release(image) != release:
        raise KernelUnavailableError(f"{image} says it is {image_release(image)}, its "
                                     f"modules are for {release}")
    return Kernel(name, release, image, root, f"{package} {version} from {track.suite}")
