"""Builds uffdkvm._core: the C core in csrc/ plus its one-file Python binding.

Only on x86-64 Linux: the guest (csrc/kvm/guest.S) is x86-64 code and the core
drives KVM's x86 interface, so anywhere else the build stops before
compiling and says why.

One build serves Python 3.10 and every later version: the binding uses only
the limited API (Py_LIMITED_API 3.10), the extension is _core.abi3.so and
the wheel is tagged cp310-abi3.

Test hooks (fault injection, for the test suites) are built only when the
environment says UFFDKVM_TEST_HOOKS=1: then the C macro UKVM_TEST_HOOKS is
defined and uffdkvm/_testing.py ships; otherwise neither is in the build,
and uffdkvm._core.TEST_HOOKS is False. The tests' install command is

    UFFDKVM_TEST_HOOKS=1 pip install '.[test]'
"""
import os
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

CSRC = Path("csrc")
LIMITED_API = "0x030A0000"  # Python 3.10: the oldest requires-python allows
TESTING_MODULE = ("uffdkvm", "_testing")


def test_hooks_requested():
    value = os.environ.get("UFFDKVM_TEST_HOOKS", "")
    if value not in ("", "0", "1"):
        raise SystemExit(f"UFFDKVM_TEST_HOOKS={value!r}: set it to 1 to build the test hooks "
                         "(fault injection), or to 0 or nothing to leave them out")
    return value == "1"


def check_platform():
    """Stops the build, before anything is compiled, unless the target is
    x86-64 Linux (sysconfig's platform is the target's when cross-compiling)."""
    target = sysconfig.get_platform()
    if target != "linux-x86_64":
        raise SystemExit(
            f"uffdkvm builds only for x86-64 Linux, and this build is for {target}: "
            "its guest (csrc/kvm/guest.S) is x86-64 code and it drives KVM's x86 interface "
            "(KVM_SET_SREGS, KVM_SET_CPUID2, page tables), which other machines lack.")


class BuildExt(build_ext):
    """Checks the platform first; builds again when the test-hook choice
    differs from the existing build's (setuptools would call an unchanged
    source up to date); teaches the compiler that .S (csrc/kvm/guest.S) is a source (gcc and
    clang preprocess and assemble it)."""

    def run(self):
        check_platform()
        super().run()
        if self.inplace:
            for ext in self.extensions:
                remove_shadowing_builds(Path(self.get_ext_fullpath(ext.name)))

    def build_extensions(self):
        self.compiler.src_extensions.append(".S")
        super().build_extensions()

    def build_extension(self, ext):
        # The choice the objects in build_temp were compiled with.
        stamp = Path(self.build_temp) / "uffdkvm-test-hooks"
        want = "1" if test_hooks_requested() else "0"
        force = self.force
        if not stamp.exists() or stamp.read_text() != want:
            self.force = True
        try:
            super().build_extension(ext)
        finally:
            self.force = force
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(want)


def remove_shadowing_builds(path):
    """An in-place build from before the limited API (_core.cpython-3XX-*.so)
    would be imported before the new _core.abi3.so: remove it."""
    stem = path.name.split(".", 1)[0]
    for old in path.parent.glob(f"{stem}.*.so"):
        if old.name != path.name:
            old.unlink()


class BuildPy(build_py):
    """Leaves uffdkvm/_testing.py out of builds without test hooks: the
    user's wheel has no fault injection. (MANIFEST.in still puts it in the
    sdist, so that the sdist can be built for its tests.)"""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        if test_hooks_requested():
            return modules
        return [m for m in modules if (m[0], m[1]) != TESTING_MODULE]


macros = [("Py_LIMITED_API", LIMITED_API)]
if test_hooks_requested():
    macros.append(("UKVM_TEST_HOOKS", "1"))

core = Extension(
    "uffdkvm._core",
    # csrc/ and its layer folders (base/, kvm/, uffd/, experiment/: csrc/README.md).
    sources=sorted(str(p) for p in CSRC.rglob("*.c")) + sorted(str(p) for p in CSRC.rglob("*.S")),
    depends=sorted(str(p) for p in CSRC.rglob("*.h")),
    include_dirs=[str(CSRC)],
    define_macros=macros,
    py_limited_api=True,
    extra_compile_args=["-std=gnu11", "-D_GNU_SOURCE", "-pthread", "-fvisibility=hidden",
                        "-Wall", "-Wextra", "-Wno-unused-parameter", "-O2"],
    extra_link_args=["-pthread"],
    libraries=["m"],
)

setup(
    ext_modules=[core],
    cmdclass={"build_ext": BuildExt, "build_py": BuildPy},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
