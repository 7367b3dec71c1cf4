"""Every sample output in README.md and docs/*.md is real output of the code
or command shown above it.

A sample is a fenced block of output (```text, or a bare ``` right after a
shell block) that follows a ```python block or a one-command ```sh block. The
test runs that code (Python in this process, each block on its own, so a
block that shows output must be complete: imports included; a command as
``python -m uffdkvm ...``) and compares the output's shape with the
sample's: every line the same once numbers are masked (column headers,
field names, reprs, line structure; a line ``...`` in the sample stands for
any lines), plus what is exact for a given command: the first line of the
README's first script (verified, faults, pages), every ``count=`` of a
Histogram, and the first cell of each Markdown table row. Timings vary from
run to run; names and counts do not.

For a sweep command, the test runs one trial of each point (``--trials 1``)
and compares the Markdown table only: its shape does not depend on the
number of trials, its footnotes do.

To refresh the samples after an output change: ``python tests/project/test_examples.py``
prints each covered block's real output, with the file and line it belongs to.
"""
from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

if __name__ == "__main__":
    # Run as a script (above), Python puts this file's folder on the path, and the
    # helpers are in the one above it, tests/.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.hostfacts import NO_STEADY_KVM_TSC_OFFSET

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)\s*$")
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:0x[0-9a-f]+|\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?)k?s?(?![\w])",
                    re.IGNORECASE)
RUN_S = 120  # a generous bound for one command: this catches a hang, not slowness


@dataclass
class Block:
    path: Path
    line: int          # 1-based line of the opening fence
    lang: str
    text: str


@dataclass
class Example:
    code: Block
    output: Block

    @property
    def id(self) -> str:
        return f"{self.output.path.name}:{self.output.line}"


def blocks(path: Path) -> list[Block]:
    found, current, start, lang = [], None, 0, ""
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = FENCE.match(line)
        if current is None and m:
            current, start, lang = [], n, m.group(1)
        elif current is not None and line.strip() == "```":
            found.append(Block(path, start, lang, "\n".join(current) + "\n"))
            current = None
        elif current is not None:
            current.append(line)
    return found


def is_output(b: Block, before: Block | None) -> bool:
    """```text, or a bare ``` right after a shell block (cli.md's style)."""
    return b.lang == "text" or (b.lang == "" and before is not None and before.lang == "sh")


def commands(b: Block) -> list[str]:
    return [line for line in b.text.splitlines() if line.strip() and not line.startswith("#")]


def examples(path: Path) -> tuple[list[Example], list[Block]]:
    """The page's (code, sample output) pairs, and the output blocks that
    follow no runnable code (a shell block of several commands, say)."""
    found, orphans = [], []
    bs = blocks(path)
    for before, b in zip([None, *bs], bs, strict=False):
        if not is_output(b, before):
            continue
        if before is not None and (before.lang == "python"
                                   or (before.lang == "sh" and len(commands(before)) == 1
                                       and commands(before)[0].startswith("uffdkvm"))):
            found.append(Example(before, b))
        else:
            orphans.append(b)
    return found, orphans


ALL = [e for p in PAGES for e in examples(p)[0]]


def is_sweep(e: Example) -> bool:
    return e.code.lang == "sh" and commands(e.code)[0].split()[1:2] == ["sweep"]


def run(e: Example) -> str:
    """The real output of the example's code, now."""
    if e.code.lang == "python":
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(e.code.text, f"{e.code.path.name}:{e.code.line}", "exec"), {})
        return out.getvalue()
    argv = shlex.split(commands(e.code)[0].split("  #")[0])
    if is_sweep(e):  # one trial per point: the table's shape does not depend on trials
        i = argv.index("--trials") if "--trials" in argv else None
        if i is not None:
            argv[i + 1] = "1"
        argv.append("--no-progress")
    # The uffdkvm under test, first on the child's path.
    from helpers.children import ENV, uffdkvm_command
    done = subprocess.run(uffdkvm_command(*argv[1:]), capture_output=True,
                          text=True, timeout=RUN_S, env=ENV)
    assert done.returncode == 0, f"{shlex.join(argv)} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


def mask(line: str) -> str:
    # A lone "-" is the CLI's cell for a number that has no value (a reader
    # that resolved no fault has no percentiles): a number's place too.
    return " ".join("#" if word == "-" else word for word in NUMBER.sub("#", line).split())


def shape(lines: list[str]) -> re.Pattern[str]:
    parts = [r"(?:[^\n]*\n)*?" if line.strip() == "..." else re.escape(mask(line)) + r"\n"
             for line in lines]
    return re.compile("".join(parts) + r"\Z")


def table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def unsynced(sample: str) -> str:
    """The sample as a kernel whose KVM moves the guest's TSC offset (a
    nested guest under TCG) prints it: guest_timing's queue and resume
    stages None (clock_sync None, as README.md says), service as it was."""
    lines = sample.splitlines(keepends=True)
    stamped = [i for i, line in enumerate(lines) if line.startswith("Histogram(")]
    for i in (stamped[0], stamped[-1]) if len(stamped) == 3 else ():
        lines[i] = "None\n"
    return "".join(lines)


def compare(e: Example, real: str) -> None:
    sample = e.output.text
    if "guest_timing=True" in e.code.text and NO_STEADY_KVM_TSC_OFFSET.holds:
        sample = unsynced(sample)
    where = f"{e.output.path.name} line {e.output.line}"
    if is_sweep(e):
        want, got = table_rows(sample), table_rows(real)
        assert [mask(x) for x in want[:2]] == [mask(x) for x in got[:2]], \
            f"{where}: the table's header differs from the real one:\n{real}"
        assert [x.split("|")[1].strip() for x in want[2:]] == \
            [x.split("|")[1].strip() for x in got[2:]], f"{where}: rows differ:\n{real}"
        return
    real_masked = "".join(mask(x) + "\n" for x in real.rstrip("\n").splitlines())
    assert shape(sample.rstrip("\n").splitlines()).match(real_masked), \
        f"{where}: the sample's shape is not the real output's.\nsample:\n{sample}\nreal:\n{real}"
    assert re.findall(r"count=(\d+)", sample) == re.findall(r"count=(\d+)", real), \
        f"{where}: Histogram counts differ (they are exact for a given command):\n{real}"
    for want, got in zip(table_rows(sample), table_rows(real), strict=True):
        assert want.split("|")[1].strip() == got.split("|")[1].strip(), f"{where}: {got}"


def test_examples_are_found():
    ids = {e.id for e in ALL}
    readme = [e for e in ALL if e.output.path.name == "README.md"]
    assert len(readme) == 1, f"README's first script, found {sorted(ids)}"
    sweeps = [e for e in ALL if e.output.path.name == "sweeps.md"]
    assert sweeps, f"docs/sweeps.md's first sweep, found {sorted(ids)}"


@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_every_sample_follows_its_code(path):
    """An output block that follows no runnable code cannot be checked: put it
    under the one command or self-contained Python block that prints it."""
    orphans = examples(path)[1]
    assert not orphans, [f"{b.path.name}:{b.line}" for b in orphans]


@pytest.mark.kvm
@pytest.mark.parametrize("example", ALL, ids=[e.id for e in ALL])
def test_sample_is_real_output(kvm, example):
    compare(example, run(example))


@pytest.mark.kvm
def test_readme_first_script_counts(kvm):
    """The first line of the README's first script is exact: verified, one
    fault per 4 KiB page (2 x 16 MiB = 8192), and each vCPU's pages."""
    first = next(e for e in ALL if e.output.path.name == "README.md")
    real = run(first)
    assert real.splitlines()[0] == first.output.text.splitlines()[0] == "True 8192 4096"


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    for e in ALL:
        print(f"===== {e.output.path.relative_to(ROOT)}:{e.output.line}")
        print(run(e), end="")
