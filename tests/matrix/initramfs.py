"""The matrix guest's initramfs: busybox, init.sh, and the kernel's modules.

Modules are copied decompressed (6.12's package ships .ko.xz, which busybox's
insmod cannot read) under their path below the kernel's module directory,
and listed in load order in /modules.order; /out.path holds the output
directory's path on the host, which init.sh mounts there and runs job.sh from.
"""
from __future__ import annotations

import gzip
import lzma
import pathlib
import shutil
import subprocess
import tempfile

from kernels import GUEST_MODULES, Kernel, module_files

HERE = pathlib.Path(__file__).resolve().parent
BUSYBOX = pathlib.Path("/bin/busybox")


def _decompressed(path: pathlib.Path) -> tuple[str, bytes]:
    data = path.read_bytes()
    name = path.name
    if name.endswith(".xz"):
        return name[:-3], lzma.decompress(data)
    if name.endswith(".gz"):
        return name[:-3], gzip.decompress(data)
    if name.endswith(".zst"):
        out = subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=True)
        return name[:-4], out.stdout
    return name, data


def build(kernel: Kernel, out_path: str, dest: pathlib.Path) -> pathlib.Path:
    """Writes the initramfs for `kernel` whose job lives in `out_path`; returns its path."""
    dynamic = BUSYBOX.exists() and subprocess.run(["ldd", str(BUSYBOX)],
                                                  capture_output=True).returncode == 0
    if not BUSYBOX.exists() or dynamic:
        raise RuntimeError("the matrix needs a static busybox (the guest's /init is busybox "
                           "itself): apt-get install busybox-static")
    moddir = kernel.root / "lib" / "modules" / kernel.release
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for d in ("bin", "proc", "sys", "dev", "host", "lib/modules"):
            (root / d).mkdir(parents=True)
        shutil.copy(BUSYBOX, root / "bin" / "busybox")
        shutil.copy(HERE / "init.sh", root / "init")
        (root / "init").chmod(0o755)
        order = []
        for ko in module_files(kernel, GUEST_MODULES):
            name, data = _decompressed(ko)
            rel = ko.parent.relative_to(moddir) / name
            (root / "lib/modules" / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / "lib/modules" / rel).write_bytes(data)
            order.append(str(rel))
        (root / "modules.order").write_text("".join(f"{m}\n" for m in order))
        (root / "out.path").write_text(out_path)
        files = subprocess.run(["find", "."], cwd=root, capture_output=True, text=True,
                               check=True).stdout
        cpio = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root,
                              input=files.encode(), capture_output=True, check=True).stdout
    dest.write_bytes(gzip.compress(cpio, compresslevel=1))
    return dest
