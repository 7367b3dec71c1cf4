"""The C core under sanitizers: the programs in tests/c, built with the core
and run by ``make -C tests/c check-asan`` (AddressSanitizer, UndefinedBehavior-
Sanitizer and LeakSanitizer) and ``check-tsan`` (ThreadSanitizer).

Each make target is one test here. It fails on any failing program or any
sanitizer report, and shows the programs' output; it skips, with the reason,
on a host without a C compiler, make, the sanitizer runtime or KVM.
"""
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.kvm

C_TESTS = Path(__file__).parent / "c"
# The flags that need a runtime library; the Makefile adds the rest.
SANITIZER_FLAGS = {
    "asan": ["-fsanitize=address,undefined"],
    "tsan": ["-fsanitize=thread"],
}
SUMMARY = re.compile(r"^(asan|tsan): (\d+) passed, (\d+) failed, (\d+) skipped", re.M)


def toolchain_reason(variant):
    """None when this host can build variant's programs, else why not."""
    cc = shlex.split(os.environ.get("CC", "cc"))  # what make's $(CC) will be
    if not shutil.which(cc[0]):
        return f"no C compiler: {cc[0]!r} is not on PATH (set CC)"
    if not shutil.which("make"):
        return "no make on PATH"
    flags = SANITIZER_FLAGS[variant]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text("int main(void) { return 0; }\n")
        p = subprocess.run([*cc, *flags, "-pthread", "-o", str(Path(tmp) / "probe"), str(src)],
                           capture_output=True, text=True, timeout=60)
    if p.returncode:
        return (f"{' '.join(cc)} cannot link a program with {' '.join(flags)}: is the "
                f"sanitizer runtime installed (libasan, libubsan; libtsan)? "
                f"{p.stderr.strip()[-500:]}")
    return None


@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_c_programs_pass_under_sanitizers(kvm, variant):
    reason = toolchain_reason(variant)
    if reason:
        pytest.skip(reason)
    cmd = ["make", "-s", "--no-print-directory", "-C", str(C_TESTS),
           f"-j{os.cpu_count() or 1}", f"check-{variant}"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=600)
    print(p.stdout)  # the PASS/SKIP lines, for pytest -rP or -s
    if p.returncode:
        pytest.fail(f"{' '.join(cmd)} exited with {p.returncode}:\n{p.stdout}", pytrace=False)
    m = SUMMARY.search(p.stdout)
    assert m, f"no summary line in the output of {' '.join(cmd)}:\n{p.stdout}"
    passed, failed, skipped = map(int, m.group(2, 3, 4))
    assert failed == 0
    if passed == 0:
        pytest.skip(f"every program skipped:\n{p.stdout}")
