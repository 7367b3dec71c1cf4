"""Builds uffdkvm._core: the C core in csrc/ plus its one-file Python binding.

Only on x86-64 Linux: the guest (csrc/kvm/guest.S) is x86-64 code and the core
drives KVM's x86 interface, so anywhere else the build stops before
compiling and says why.

One build serves Python 3.10 and every later version: the binding uses only
the limited API (Py_LIMITED_API 3.10), the extension is _core.abi3.so and
the wheel is tagged cp310-abi3.

Test hooks (fault injection, for the test suites) are built only when the
environment says UFFDKVM_TEST_HOOKS=1: then the C macro UKVM_TEST_HOOKS is
defined and uffdkvm/testing/_faults.py ships; otherwise neither is in the build,
and uffdkvm._core.TEST_HOOKS is False. The tests' install command is

    UFFDKVM_TEST_HOOKS=1 pip install '.[test]'

wait="io_uring" needs liburing: where the compiler finds <liburing.h> and the
static library liburing.a (Debian, Ubuntu: apt-get install liburing-dev), the
build defines UKVM_HAVE_LIBURING and links liburing.a into the extension, its
symbols kept private, so the wheel depends on no liburing.so (auditwheel
grafts nothing). Without them, or with UFFDKVM_NO_LIBURING=1 in the
environment, it builds without: uffdkvm._core.HAVE_IO_URING is then False
and wait="io_uring" is refused, saying how to get it.

Page server keys (HMAC-SHA256, csrc/remote/auth.c) need OpenSSL's libcrypto:
where the compiler finds <openssl/hmac.h> (Debian, Ubuntu: apt-get install
libssl-dev), the build defines UKVM_HAVE_LIBCRYPTO, and the core loads the
system's shared libcrypto (libcrypto.so.3 for OpenSSL 3's headers) with
dlopen when it first needs it: the system's own copy, which its security
updates keep current, never a copy in the wheel, and no needed library that
would keep the wheel from being manylinux. Without the headers, with
UFFDKVM_NO_LIBCRYPTO=1, or where the library does not load,
uffdkvm._core.HAVE_LIBCRYPTO is False and every page server on TCP, or with
a key, is refused rather than run without one.
"""
import concurrent.futures
import functools
import os
import shlex
import subprocess
import sysconfig
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

CSRC = Path("csrc")
LIMITED_API = "0x030A0000"  # Python 3.10: the oldest requires-python allows
TESTING_MODULE = ("uffdkvm.testing", "_faults")


def test_hooks_requested():
    value = os.environ.get("UFFDKVM_TEST_HOOKS", "")
    if value not in ("", "0", "1"):
        raise SystemExit(f"UFFDKVM_TEST_HOOKS={value!r}: set it to 1 to build the test hooks "
                         "(fault injection), or to 0 or nothing to leave them out")
    return value == "1"


def liburing_refused():
    value = os.environ.get("UFFDKVM_NO_LIBURING", "")
    if value not in ("", "0", "1"):
        raise SystemExit(f"UFFDKVM_NO_LIBURING={value!r}: set it to 1 to build without liburing "
                         "(no wait=\"io_uring\"), or to 0 or nothing to use it where found")
    return value == "1"


def libcrypto_refused():
    value = os.environ.get("UFFDKVM_NO_LIBCRYPTO", "")
    if value not in ("", "0", "1"):
        raise SystemExit(f"UFFDKVM_NO_LIBCRYPTO={value!r}: set it to 1 to build without "
                         "libcrypto (no page server keys, no TCP), or to 0 or nothing to use "
                         "it where found")
    return value == "1"


def find_libcrypto(cc):
    """Whether <openssl/hmac.h> compiles and a shared object links with -lcrypto
    (the library the core will dlopen is there)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "hmac.c"
        src.write_text("#include <openssl/crypto.h>\n#include <openssl/evp.h>\n"
                       "#include <openssl/hmac.h>\n"
                       "int mac(unsigned char *m, unsigned int *n) {\n"
                       "  return HMAC(EVP_sha256(), \"k\", 1, m, 1, m, n) != 0 && "
                       "CRYPTO_memcmp(m, m, 1) == 0; }\n")
        try:
            p = subprocess.run([*cc, "-fPIC", "-shared", str(src), "-lcrypto",
                                "-o", str(Path(tmp) / "hmac.so")],
                               capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return False
    return p.returncode == 0


def compiler_command(compiler):
    """The C compiler the build uses, as a list (setuptools' own, else $CC or cc)."""
    return list(getattr(compiler, "compiler_so", None) or shlex.split(os.environ.get("CC", "cc")))


def find_liburing(cc):
    """The path of liburing.a where the compiler finds it and <liburing.h>, and
    a shared object (as the extension is) links with it; else None."""
    try:
        found = subprocess.run([*cc, "-print-file-name=liburing.a"], capture_output=True,
                               text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not os.path.isabs(found) or not os.path.isfile(found):
        return None  # gcc echoes the bare name when it finds no such file
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "uring.c"
        src.write_text("#include <liburing.h>\n"
                       "int uring(void) { struct io_uring r; return io_uring_queue_init(1, &r, 0); }\n")
        try:
            p = subprocess.run([*cc, "-fPIC", "-shared", str(src), found,
                                "-o", str(Path(tmp) / "uring.so")],
                               capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return None
    return found if p.returncode == 0 else None


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
    """Checks the platform first; looks for liburing and libcrypto; builds
    again when the test-hook, liburing or libcrypto choice differs from the
    existing build's (setuptools would call an unchanged source up to date);
    teaches the compiler that .S (csrc/kvm/guest.S) is a source (gcc and
    clang preprocess and assemble it); compiles the sources in parallel."""

    def run(self):
        check_platform()
        super().run()
        if self.inplace:
            for ext in self.extensions:
                remove_shadowing_builds(Path(self.get_ext_fullpath(ext.name)))

    def build_extensions(self):
        self.compiler.src_extensions.append(".S")
        uring = None if liburing_refused() else find_liburing(compiler_command(self.compiler))
        for ext in self.extensions:
            if uring:
                ext.define_macros.append(("UKVM_HAVE_LIBURING", "1"))
                ext.extra_objects.append(uring)
                # liburing's functions stay inside the extension, not exported.
                ext.extra_link_args.append("-Wl,--exclude-libs,liburing.a")
        self.announce(f"uffdkvm: wait=\"io_uring\" {'with ' + uring if uring else 'not built'}"
                      + ("" if uring else " (UFFDKVM_NO_LIBURING=1)" if liburing_refused() else
                         " (no <liburing.h> and liburing.a: apt-get install liburing-dev)"),
                      level=2)
        self.uring = uring
        crypto = not libcrypto_refused() and find_libcrypto(compiler_command(self.compiler))
        for ext in self.extensions:
            if crypto:
                ext.define_macros.append(("UKVM_HAVE_LIBCRYPTO", "1"))
                ext.libraries.append("dl")   # dlopen: in libc since glibc 2.34, libdl before
        self.announce(f"uffdkvm: page server keys {'with libcrypto' if crypto else 'not built'}"
                      + ("" if crypto else " (UFFDKVM_NO_LIBCRYPTO=1)" if libcrypto_refused()
                         else " (no <openssl/hmac.h> and libcrypto: apt-get install "
                              "libssl-dev); TCP page servers are refused"), level=2)
        self.crypto = crypto
        parallel = compiles_in_parallel(self.compiler)
        if parallel:
            # The one extension's sources, --parallel N (N > 1) at a time, else
            # one a CPU this process may run on.
            jobs = self.parallel if type(self.parallel) is int and self.parallel > 0 \
                else len(os.sched_getaffinity(0))
            self.compiler.compile = functools.partial(compile_in_parallel, self.compiler, jobs)
        try:
            super().build_extensions()
        finally:
            if parallel:
                del self.compiler.compile

    def build_extension(self, ext):
        # The choices the objects in build_temp were compiled with.
        stamp = Path(self.build_temp) / "uffdkvm-test-hooks"
        want = ("1" if test_hooks_requested() else "0") + (" uring" if self.uring else "") + \
            (" crypto" if self.crypto else "")
        force = self.force
        if not stamp.exists() or stamp.read_text() != want:
            self.force = True
        try:
            super().build_extension(ext)
        finally:
            self.force = force
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(want)


def compiles_in_parallel(compiler):
    """Whether compile_in_parallel can stand in for this compiler's compile():
    distutils' own compile() over _compile(), as the unix compiler has (one
    that overrides compile() itself, as msvc's does, is left alone)."""
    own = getattr(type(compiler).compile, "__qualname__", "")
    return own in ("CCompiler.compile", "Compiler.compile") and all(
        hasattr(compiler, name) for name in ("_setup_compile", "_get_cc_args", "_compile"))


def compile_in_parallel(compiler, jobs, sources, output_dir=None, macros=None,
                        include_dirs=None, debug=False, extra_preargs=None,
                        extra_postargs=None, depends=None):
    """distutils' CCompiler.compile, its sources compiled ``jobs`` at a time:
    setuptools compiles one extension's sources one after another, and the
    core is one extension of some fifty files. The same steps (the objects'
    folders made first, the same flags, the objects in the sources' order);
    threads suffice, as each compile is a child process. The first failure
    (or Ctrl-C) cancels the compiles not yet started, and is raised."""
    macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs)
    cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

    def one(obj):
        src, ext = build[obj]
        compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)
    pool = concurrent.futures.ThreadPoolExecutor(max(1, jobs))
    try:
        for done in [pool.submit(one, obj) for obj in objects if obj in build]:
            done.result()
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return objects


def remove_shadowing_builds(path):
    """An in-place build from before the limited API (_core.cpython-3XX-*.so)
    would be imported before the new _core.abi3.so: remove it."""
    stem = path.name.split(".", 1)[0]
    for old in path.parent.glob(f"{stem}.*.so"):
        if old.name != path.name:
            old.unlink()


class BuildPy(build_py):
    """Leaves uffdkvm/testing/_faults.py out of builds without test hooks: the
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
