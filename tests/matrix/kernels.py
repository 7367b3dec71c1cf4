"""Debian's own kernels for the matrix: fetched as packages, never installed.

A kernel is named by the Debian metapackage that tracks it (linux-image-amd64
is bookworm's 6.1, linux-image-6.12-amd64 its 6.12 from the security
archive). fetch() resolves the metapackage to today's image package, takes
it with `apt-get download`, unpacks it with `dpkg-deb -x` into a cache
directory and runs depmod there, so that `modprobe --show-depends` can give
the order in which the guest must load a module and what it leans on.
Nothing goes into the host's /lib/modules.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import tempfile

# The matrix's kernels: a short name, and the metapackage that tracks it.
KERNELS = {
    "6.1": "linux-image-amd64",
    "6.12": "linux-image-6.12-amd64",
}

# What the guest loads before its job runs: KVM for AMD (TCG's -cpu max
# emulates SVM with nested paging) and 9p over virtio for the host's files.
GUEST_MODULES = ["kvm_amd", "virtio_pci", "9pnet_virtio", "9p"]


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str            # the matrix's name: "6.1"
    package: str         # the image package: "linux-image-6.1.0-57-amd64"
    release: str         # its uname -r: "6.1.0-57-amd64"
    root: pathlib.Path   # where the package was unpacked
    vmlinuz: pathlib.Path


def cache_dir() -> pathlib.Path:
    """Where packages are kept between runs (UFFDKVM_MATRIX_CACHE)."""
    default = pathlib.Path.home() / ".cache" / "uffdkvm" / "matrix"
    return pathlib.Path(os.environ.get("UFFDKVM_MATRIX_CACHE", default))


def _run(argv: list[str], cwd: pathlib.Path | None = None) -> str:
    p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)
    if p.returncode:
        raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def image_package(metapackage: str) -> str:
    """The image package a metapackage depends on today."""
    for line in _run(["apt-cache", "depends", metapackage]).splitlines():
        dep = line.strip().removeprefix("Depends:").strip()
        if line.strip().startswith("Depends:") and dep.startswith("linux-image-"):
            return dep
    raise RuntimeError(f"apt-cache depends {metapackage} names no linux-image package "
                       "(run apt-get update first)")


def fetch(name: str) -> Kernel:
    """The kernel named `name` (a key of KERNELS), downloaded and unpacked once."""
    package = image_package(KERNELS[name])
    root = cache_dir() / package
    debs = cache_dir() / "debs"
    if not (root / ".unpacked").exists():
        debs.mkdir(parents=True, exist_ok=True)
        if not any(debs.glob(f"{package}_*.deb")):
            # Into a directory of its own first: an interrupted download must
            # not leave a .deb that later runs take for whole.
            with tempfile.TemporaryDirectory(dir=debs) as part:
                try:
                    _run(["apt-get", "download", "-q", package], cwd=pathlib.Path(part))
                except RuntimeError:  # lists older than the archive: once more, updated
                    _run(["apt-get", "update", "-qq"])
                    _run(["apt-get", "download", "-q", package], cwd=pathlib.Path(part))
                for done in pathlib.Path(part).glob("*.deb"):
                    done.rename(debs / done.name)
        (deb,) = debs.glob(f"{package}_*.deb")
        root.mkdir(parents=True, exist_ok=True)
        _run(["dpkg-deb", "-x", str(deb), str(root)])
        (release,) = os.listdir(root / "lib" / "modules")
        _run(["depmod", "-b", str(root), release])
        (root / ".unpacked").touch()
    (release,) = os.listdir(root / "lib" / "modules")
    return Kernel(name, package, release, root, root / "boot" / f"vmlinuz-{release}")


def module_files(kernel: Kernel, modules: list[str]) -> list[pathlib.Path]:
    """The .ko files to insmod, in order, for `modules` and what they need
    (a module built into the kernel has none)."""
    files: list[pathlib.Path] = []
    for module in modules:
        out = _run(["modprobe", "-d", str(kernel.root), "-S", kernel.release,
                    "--show-depends", module])
        for line in out.splitlines():
            words = line.split()
            if words[:1] == ["insmod"]:
                path = pathlib.Path(words[1])
                if path not in files:
                    files.append(path)
    return files
