"""Builds uffdkvm._core: the C core in csrc/ plus its one-file Python binding."""
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CSRC = Path("csrc")


class BuildExt(build_ext):
    """The guest code is an assembly file (csrc/kvm/guest.S): teach the compiler
    that .S is a source, which gcc and clang preprocess and assemble."""

    def build_extensions(self):
        self.compiler.src_extensions.append(".S")
        super().build_extensions()


core = Extension(
    "uffdkvm._core",
    # csrc/ and its layer folders (base/, kvm/, uffd/, experiment/: csrc/README.md).
    sources=sorted(str(p) for p in CSRC.rglob("*.c")) + [str(CSRC / "kvm" / "guest.S")],
    depends=sorted(str(p) for p in CSRC.rglob("*.h")),
    include_dirs=[str(CSRC)],
    extra_compile_args=["-std=gnu11", "-D_GNU_SOURCE", "-pthread", "-fvisibility=hidden",
                        "-Wall", "-Wextra", "-Wno-unused-parameter", "-O2"],
    extra_link_args=["-pthread"],
    libraries=["m"],
)

setup(ext_modules=[core], cmdclass={"build_ext": BuildExt})
