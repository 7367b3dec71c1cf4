"""The notebooks in notebooks/: committed without outputs, and each one runs
from top to bottom at UFFDKVM_NB_SCALE=small without a cell error through a
Jupyter kernel, and could as a plain Python script of its code cells
(nothing in them needs IPython, such as a bare display() or a %magic).

Each notebook is executed once (a module fixture; its file is never
written) by a kernel of this very Python, from a temporary working
directory (whatever a notebook writes lands there), with the uffdkvm these
tests import first on its path: a worktree's own uffdkvm, not whichever one
is installed. The tests then read what it printed and drew. As a plain
script, every notebook is checked for what only IPython gives (a %magic, a
name it never binds), and two run that way end to end: reader_scaling a
second time, over the sweeps its first run kept, and restore with its
temporary directory on tmpfs.
"""
import builtins
import json
import os
import shutil
import subprocess
import symtable
import sys
import tempfile
import time
from pathlib import Path

import pytest

import uffdkvm
from helpers.children import python
from helpers.hostfacts import NO_STEADY_KVM_TSC_OFFSET

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
KERNEL = "uffdkvm-tests"  # a kernel spec of our own, so no other "python3" is picked up
SMALL_RUN_S = 60          # each takes well under 20 s here; this catches a runaway
# A cell, or a notebook run as a script, may take this long before it is
# called hung: a notebook's time is test_runs_small's business (an emulated
# guest takes 2-5 times SMALL_RUN_S).
HANG_S = 900


def ids(paths):
    return [p.stem for p in paths]


def test_the_notebooks_are_there():
    assert {p.stem for p in NOTEBOOKS} >= {"reader_scaling", "latency", "backing_sources",
                                           "restore", "migration"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_committed_without_outputs(path):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: cell {i} has outputs; clear them"
            assert cell.execution_count is None, \
                f"{path.name}: cell {i} has an execution count; clear outputs before committing"


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory, monkeypatch_module):
    """A kernel spec running this interpreter, found first through JUPYTER_PATH,
    and the small scale for every notebook."""
    pytest.importorskip("ipykernel")
    data = tmp_path_factory.mktemp("jupyter")
    spec = data / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": python("-f", "{connection_file}", module="ipykernel_launcher"),
        "display_name": f"uffdkvm tests ({sys.executable})",
        "language": "python",
    }))
    monkeypatch_module.setenv("JUPYTER_PATH", str(data))
    package_root = str(Path(uffdkvm.__file__).resolve().parents[2])
    monkeypatch_module.setenv("PYTHONPATH", os.pathsep.join(
        [package_root, *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch_module.setenv("UFFDKVM_NB_SCALE", "small")
    monkeypatch_module.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch_module.delenv("UFFDKVM_NB_HUGEPAGES", raising=False)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


# The notebooks that show the guest's stages: where KVM moves the guest's TSC
# offset (the host fact's own reading says whether it does) they say there are
# none, and why; elsewhere they never say so.
STAGE_TIMED = {"reader_scaling", "latency"}
NO_STAGES = "no stages on this host: KVM's TSC offset of vCPU "


class Executed:
    """A notebook run once through the kernel: the notebook with its
    outputs, what its cells showed as text (printed, or displayed: a table
    the notebook prints where there is no IPython), how long it took, and
    its directory."""

    def __init__(self, nb, took, where):
        self.nb, self.took, self.where = nb, took, where
        self.code = [c for c in nb.cells if c.cell_type == "code"]
        self.shown = "".join(_text(o) for c in self.code for o in c.outputs)


def _text(output):
    if output.output_type == "stream":
        return output.text if output.name == "stdout" else ""
    if output.output_type in ("display_data", "execute_result"):
        return output.get("data", {}).get("text/plain", "") + "\n"
    return ""


@pytest.fixture(scope="module")
def executed(kernel_env, tmp_path_factory):
    """path -> Executed: each notebook run once, on first use, from a
    directory of its own; the last cell, added in memory only, says which
    uffdkvm the kernel ran. A failing cell fails every test that asks."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    runs = {}

    def get(path):
        if path not in runs:
            nb = nbformat.read(path, as_version=4)
            nb.cells.append(nbformat.v4.new_code_cell("import uffdkvm; print(uffdkvm.__file__)"))
            where = tmp_path_factory.mktemp(path.stem)
            client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=HANG_S,
                                             startup_timeout=HANG_S,
                                             resources={"metadata": {"path": str(where)}})
            start = time.monotonic()
            try:
                client.execute()  # CellExecutionError, with the traceback, on a failing cell
                runs[path] = Executed(nb, time.monotonic() - start, where)
            except Exception as e:  # kept, and raised to each test that asks
                runs[path] = e
        if isinstance(runs[path], Exception):
            raise runs[path]
        return runs[path]
    return get


@pytest.mark.kvm
@pytest.mark.slow  # every notebook's experiments, in a Jupyter kernel
@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_runs_through_a_kernel_and_draws(kvm, hugepages, executed, path):
    run = executed(path)
    errors = [o for c in run.code for o in c.outputs if o.output_type == "error"]
    assert not errors
    images = [o for c in run.code for o in c.outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name} drew no plot"
    ran = run.code[-1].outputs[0]["text"].strip()
    assert ran == str(Path(uffdkvm.__file__).resolve()), \
        f"the kernel imported {ran}, not the uffdkvm under test ({uffdkvm.__file__})"


@pytest.mark.kvm
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_runs_small(kvm, hugepages, executed, path):
    took = executed(path).took
    assert took < SMALL_RUN_S, f"{path.name} took {took:.0f} s at UFFDKVM_NB_SCALE=small"


@pytest.mark.kvm
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_says_what_it_found(kvm, hugepages, executed, path):
    run = executed(path)
    out = run.shown
    assert f"uffdkvm {uffdkvm.__version__} on " in out  # its first cell that prints ran
    if path.stem in STAGE_TIMED:
        assert (NO_STAGES in out) == NO_STEADY_KVM_TSC_OFFSET.holds, out[-3000:]
    if path.stem == "restore":
        # Every source this host runs, with every policy, each run verified.
        assert "24 runs, every one verified" in out, out[-2000:]
        table = out[out.index("faults_avoided"):]
        for name in ("file", "remote 30 us", "remote 200 us", "readahead", "background",
                     "replay"):
            assert name in table, name


@pytest.mark.kvm
@pytest.mark.slow
def test_reader_scaling_keeps_its_sweeps_and_a_second_run_as_a_script_reuses_them(
        kvm, hugepages, executed):
    """Its sweeps are kept with out=: a second run, here as a plain Python
    script in the same directory, loads them and measures nothing again.
    They are upstream's setting for the 2023 table."""
    path = next(p for p in NOTEBOOKS if p.stem == "reader_scaling")
    where = executed(path).where
    kept = sorted(where.glob("*.jsonl"))
    assert [p.name for p in kept] == ["reader_scaling_small.jsonl",
                                      "reader_scaling_stages_small.jsonl",
                                      "reader_scaling_vcpu_small.jsonl"], kept
    before = {p: p.read_bytes() for p in kept}
    out = run_script(path, where)
    assert f"uffdkvm {uffdkvm.__version__} on " in out
    assert {p: p.read_bytes() for p in kept} == before, "the second run swept again"
    for r in uffdkvm.read_results(kept[0]):
        c = r.config
        assert (c.uffd_mode, c.backing, c.vcpus, c.overlap) == ("minor", "shmem", 4, True), c
    # Every wait mode this host runs is compared, and the design without readers.
    # (spin_idle aside: it needs pinned readers, and the notebook's vCPUs are unpinned)
    runs_here = {w for w, why in uffdkvm.fault_path_support()["wait"].items()
                 if why is None} - {"spin_idle"}
    assert {r.config.wait for r in uffdkvm.read_results(kept[0])} == runs_here
    assert {r.config.resolver for r in uffdkvm.read_results(kept[2])} == {"vcpu"}


def script(path):
    """The notebook's code cells, in order, as one Python program."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    return "\n\n".join(c.source for c in nb.cells if c.cell_type == "code") + "\n"


def needs_ipython(source):
    """What in a program only IPython gives it: a line that is not Python
    (a %magic, a !shell escape), or a name it uses at module level or in a
    function and never binds, and that is not a builtin (display,
    get_ipython). One binding anywhere counts for every use: a script that
    passes may still fail, one that fails here cannot run."""
    try:
        top = symtable.symtable(source, "<notebook>", "exec")
    except SyntaxError as e:
        return [f"line {e.lineno}: not Python ({e.msg}): {(e.text or '').strip()}"]
    bound = {s.get_name() for s in top.get_symbols()
             if s.is_assigned() or s.is_imported() or s.is_namespace()}
    used = set()

    def walk(table):
        for s in table.get_symbols():
            if s.is_referenced() and (table is top or s.is_global()):
                used.add(s.get_name())
        for child in table.get_children():
            walk(child)
    walk(top)
    return sorted(used - bound - set(dir(builtins)))


def test_what_only_ipython_gives_is_found():
    assert needs_ipython("import pandas as pd\ndf = pd.DataFrame()\ndisplay(df)\n") == \
        ["display"]
    assert needs_ipython("def f():\n    return get_ipython()\n") == ["get_ipython"]
    assert needs_ipython("%matplotlib inline\nx = 1\n")[0].startswith("line 1: not Python")
    assert needs_ipython("!ls\n")[0].startswith("line 1: not Python")
    assert needs_ipython("import os\n[os.sep for _ in range(2)]\nclass A:\n    b = len\n") \
        == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_needs_nothing_of_ipython_as_a_script(path):
    assert needs_ipython(script(path)) == [], \
        f"{path.name} as a plain Python script needs what only IPython gives"


def run_script(path, where, **extra_env):
    (where / f"{path.stem}.py").write_text(script(path))
    env = {**os.environ, **extra_env, "UFFDKVM_NB_SCALE": "small", "MPLBACKEND": "Agg",
           "PYTHONPATH": os.pathsep.join(filter(None, [
               str(Path(uffdkvm.__file__).resolve().parents[2]),
               os.environ.get("PYTHONPATH")]))}
    env.pop("UFFDKVM_NB_HUGEPAGES", None)
    done = subprocess.run([sys.executable, f"{path.stem}.py"], cwd=where, env=env,
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, f"python {path.stem}.py failed:\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.kvm
def test_restore_runs_where_the_temporary_directory_is_tmpfs(kvm, tmp_path):
    """On tmpfs a snapshot's page cache cannot be dropped, so the cold file
    is not a source there: the notebook goes on with the page server. As a
    plain Python script."""
    pytest.importorskip("matplotlib")
    with open("/proc/mounts") as f:
        if not any(line.split()[1:3] == ["/dev/shm", "tmpfs"] for line in f):
            pytest.skip("no tmpfs at /dev/shm")
    shm = Path(tempfile.mkdtemp(prefix="uffdkvm-nb-", dir="/dev/shm"))
    try:
        out = run_script(Path(__file__).resolve().parents[2] / "notebooks" / "restore.ipynb",
                         tmp_path, TMPDIR=str(shm))
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    assert "stayed in the page cache" in out  # the cold file was refused, as on any tmpfs
    assert "remote 30 us" in out and "every one verified" in out
