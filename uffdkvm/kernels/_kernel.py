"""A kernel uffdkvm can boot under QEMU: its image, its release and its modules.

A Kernel comes from Debian's archive (_debian.py) or from the user
(brought()): a bzImage, with a module tree laid out as `make
modules_install INSTALL_MOD_PATH=DIR` leaves it (DIR/lib/modules/RELEASE,
modules.dep included), or with everything the guest needs built in.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess

from ..errors import ConfigError, HostUnsupportedError

# What the guest's init loads before its job runs, in this order: KVM for the
# CPU QEMU gives it (_qemu.py), 9p over virtio for the host's files, and
# virtio-blk with ext4 for its disk-backed TMPDIR. A module the kernel has
# built in needs no file.
VIRTIO_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "virtio_blk", "ext4")

# The x86 boot protocol: a bzImage's setup header ("HdrS" at 0x202) holds at
# 0x20e the offset, less 0x200, of the kernel's version string, whose first
# word is its `uname -r`. Debian's vmlinuz files are bzImages too.
_HDRS_OFFSET = 0x202
_VERSION_POINTER = 0x20E


class KernelUnavailableError(HostUnsupportedError):
    """A kernel that cannot be had here: a Debian package the archive (or
    this host's apt) cannot give, or a bzImage that is not one. The message
    says which and why; it is never a kernel that was tested."""


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A kernel to boot.

    name      what uffdkvm calls it: a Debian name ("6.18") or, for a kernel
              you bring, its release
    release   its ``uname -r``
    image     the bzImage QEMU boots
    modules   the tree its modules are in (DIR of DIR/lib/modules/RELEASE),
              or None when what the guest needs is built in
    origin    where it came from: the Debian package and suite, or the path
    """
    name: str
    release: str
    image: pathlib.Path
    modules: pathlib.Path | None
    origin: str

    def __str__(self) -> str:
        return f"{self.name} ({self.release}, {self.origin})"


def image_release(image: os.PathLike[str] | str) -> str:
    """The ``uname -r`` of an x86 bzImage, read from its setup header."""
    path = pathlib.Path(image)
    try:
        with open(path, "rb") as f:
            head = f.read(64 * 1024)
    except OSError as e:
        raise KernelUnavailableError(f"kernel image {path}: {e.strerror}") from None
    if head[_HDRS_OFFSET:_HDRS_OFFSET + 4] != b"HdrS" or len(head) < _VERSION_POINTER + 2:
        raise KernelUnavailableError(f"kernel image {path}: not an x86 bzImage (no 'HdrS' "
                                     f"setup header); pass arch/x86/boot/bzImage")
    at = 0x200 + int.from_bytes(head[_VERSION_POINTER:_VERSION_POINTER + 2], "little")
    text = head[at:head.find(b"\0", at)] if 0x200 < at < len(head) else b""
    words = text.decode("ascii", "replace").split()
    if not words:
        raise KernelUnavailableError(f"kernel image {path}: its setup header names no "
                                     f"version string")
    return words[0]


def module_root(modules: os.PathLike[str] | str, release: str) -> pathlib.Path:
    """DIR for a module tree given as DIR or as DIR/lib/modules/RELEASE;
    refused where modules.dep is missing (depmod has not run there)."""
    path = pathlib.Path(modules).resolve()
    root = path.parents[2] if path.name == release and path.parent.name == "modules" else path
    deps = root / "lib" / "modules" / release / "modules.dep"
    if not deps.exists():
        raise ConfigError(f"modules: no {deps}: pass the directory that `make modules_install "
                          f"INSTALL_MOD_PATH=DIR` filled (DIR or DIR/lib/modules/{release}), "
                          f"for the kernel whose release is {release}", field="modules")
    return root


def brought(image: os.PathLike[str] | str, modules: os.PathLike[str] | str | None = None,
            name: str | None = None) -> Kernel:
    """A kernel you built: its bzImage, and its module tree unless what the
    guest needs (KVM, virtio-pci, 9p, virtio-blk, ext4) is built in. Named
    by its release unless ``name`` is given."""
    path = pathlib.Path(image).resolve()
    release = image_release(path)
    if not re.fullmatch(r"[A-Za-z0-9._+~-]+", name or release):
        # It names the matrix's result files and directories.
        raise KernelUnavailableError(f"kernel image {path}: its name {name or release!r} is "
                                     f"not a plain release (letters, digits and ._+~-)")
    root = module_root(modules, release) if modules is not None else None
    return Kernel(name or release, release, path, root, str(path))


def module_files(kernel: Kernel, modules: list[str]) -> tuple[list[pathlib.Path], list[str]]:
    """The .ko files to load, in order, for ``modules`` and what they lean
    on (none for a module built in), and the modules the tree has neither
    built in nor as a file. Without a module tree: nothing to load, nothing
    known missing (the guest's init says what fails for want of it)."""
    files: list[pathlib.Path] = []
    missing: list[str] = []
    if kernel.modules is None:
        return files, missing
    for module in modules:
        p = subprocess.run(["modprobe", "-d", str(kernel.modules), "-S", kernel.release,
                            "--show-depends", module], capture_output=True, text=True,
                           timeout=60)
        if p.returncode:
            missing.append(module)
            continue
        for line in p.stdout.splitlines():
            words = line.split()
            if words[:1] == ["insmod"]:
                path = pathlib.Path(words[1])
                if path not in files:
                    files.append(path)
    return files, missing
