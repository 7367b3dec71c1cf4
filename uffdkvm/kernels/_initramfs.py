"""The guest's initramfs: busybox, init.sh, and the kernel's own modules.

Modules are copied decompressed (Debian ships .ko.xz and, from 6.18,
.ko.zst, which busybox's insmod cannot read) under their path below the
kernel's module directory, and listed in load order in /modules.order;
/out.path holds the job directory's path on the host, which init.sh mounts
there and runs job.sh from.
"""
from __future__ import annotations

import gzip
import lzma
import pathlib
import shutil
import subprocess
import tempfile

from ._kernel import VIRTIO_MODULES, Kernel, KernelUnavailableError, module_files

HERE = pathlib.Path(__file__).resolve().parent
BUSYBOX = pathlib.Path("/bin/busybox")
# Without these the guest cannot reach the host's files at all.
REQUIRED = ("virtio_pci", "9pnet_virtio", "9p")


def _decompressed(path: pathlib.Path) -> tuple[str, bytes]:
    data = path.read_bytes()
    name = path.name
    if name.endswith(".xz"):
        return name[:-3], lzma.decompress(data)
    if name.endswith(".gz"):
        return name[:-3], gzip.decompress(data)
    if name.endswith(".zst"):
        try:
            out = subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=True,
                                 timeout=120)
        except FileNotFoundError:
            raise KernelUnavailableError(f"{path} is zstd-compressed: apt-get install "
                                         f"zstd") from None
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            detail = getattr(e, "stderr", b"") or b""
            raise KernelUnavailableError(f"{path}: zstd -dc failed ({e}): "
                                         f"{detail.decode(errors='replace').strip()}") from None
        return name[:-4], out.stdout
    return name, data


def static_busybox() -> pathlib.Path:
    dynamic = BUSYBOX.exists() and subprocess.run(["ldd", str(BUSYBOX)],
                                                  capture_output=True).returncode == 0
    if not BUSYBOX.exists() or dynamic:
        raise KernelUnavailableError("booting a kernel needs a static busybox (the guest's "
                                     "/init is busybox itself): apt-get install "
                                     "busybox-static")
    return BUSYBOX


def build(kernel: Kernel, kvm_module: str, out_path: str, dest: pathlib.Path) -> pathlib.Path:
    """Writes the initramfs for ``kernel`` whose job lives in ``out_path``;
    returns its path."""
    busybox = static_busybox()
    files, missing = module_files(kernel, [kvm_module, *VIRTIO_MODULES])
    lacking = [m for m in (kvm_module, *REQUIRED) if m in missing]
    if lacking:
        raise KernelUnavailableError(f"kernel {kernel.release} has {', '.join(lacking)} "
                                     f"neither built in nor in {kernel.modules}: the guest "
                                     f"needs KVM ({kvm_module}), virtio-pci and 9p over "
                                     f"virtio")
    moddir = kernel.modules / "lib" / "modules" / kernel.release if kernel.modules else None
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for d in ("bin", "proc", "sys", "dev", "host", "lib/modules"):
            (root / d).mkdir(parents=True)
        shutil.copy(busybox, root / "bin" / "busybox")
        shutil.copy(HERE / "init.sh", root / "init")
        (root / "init").chmod(0o755)
        order = []
        for ko in files:
            assert moddir is not None
            name, data = _decompressed(ko)
            rel = ko.resolve().parent.relative_to(moddir.resolve()) / name
            (root / "lib/modules" / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / "lib/modules" / rel).write_bytes(data)
            order.append(str(rel))
        (root / "modules.order").write_text("".join(f"{m}\n" for m in order))
        (root / "out.path").write_text(out_path)
        names = subprocess.run(["find", "."], cwd=root, capture_output=True, text=True,
                               check=True).stdout
        cpio = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root,
                              input=names.encode(), capture_output=True, check=True).stdout
    dest.write_bytes(gzip.compress(cpio, compresslevel=1))
    return dest
