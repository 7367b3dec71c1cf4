"""The notebooks in notebooks/: committed without outputs, and each one runs
from top to bottom at UFFDKVM_NB_SCALE=small without a cell error, both
through a Jupyter kernel and as a plain Python script of its code cells
(so nothing in them needs IPython, such as a bare display()).

Each notebook is executed in memory (its file is never written) by a kernel
of this very Python, from a temporary working directory (whatever a notebook
writes lands there), with the uffdkvm these tests import first on its path:
a worktree's own uffdkvm, not whichever one is installed.
"""
import json
import os
import shutil
import subprocess
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
# A notebook run as a script may take this long before it is called hung: its
# time is test_runs_small's business (an emulated guest takes 2-5 times 60 s).
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


@pytest.mark.kvm
@pytest.mark.slow  # every notebook's experiments, in a Jupyter kernel
@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_runs_small(kvm, hugepages, kernel_env, tmp_path, path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    # Last, in memory only: which uffdkvm the kernel ran.
    nb.cells.append(nbformat.v4.new_code_cell("import uffdkvm; print(uffdkvm.__file__)"))
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=SMALL_RUN_S,
                                     resources={"metadata": {"path": str(tmp_path)}})
    start = time.monotonic()
    client.execute()  # raises CellExecutionError, with the traceback, on a failing cell
    took = time.monotonic() - start
    assert took < SMALL_RUN_S, f"{path.name} took {took:.0f} s at UFFDKVM_NB_SCALE=small"
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if "image/png" in o.get("data", {})]
    assert images, f"{path.name} drew no plot"
    ran = nb.cells[-1].outputs[0]["text"].strip()
    assert ran == str(Path(uffdkvm.__file__).resolve()), \
        f"the kernel imported {ran}, not the uffdkvm under test ({uffdkvm.__file__})"


def script(path):
    """The notebook's code cells, in order, as one Python program."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    return "\n\n".join(c.source for c in nb.cells if c.cell_type == "code") + "\n"


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
@pytest.mark.slow  # every notebook's experiments, as a script
@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_runs_as_plain_python(kvm, hugepages, tmp_path, path):
    pytest.importorskip("matplotlib")
    out = run_script(path, tmp_path)
    assert f"uffdkvm {uffdkvm.__version__} on " in out  # its first cell that prints ran
    if path.stem in STAGE_TIMED:
        assert (NO_STAGES in out) == NO_STEADY_KVM_TSC_OFFSET.holds, out[-3000:]
    if path.stem == "reader_scaling":
        # Its sweeps are kept with out=: a second run loads them and measures
        # nothing again, and they are upstream's setting for the 2023 table.
        kept = sorted(tmp_path.glob("*.jsonl"))
        assert [p.name for p in kept] == ["reader_scaling_small.jsonl",
                                          "reader_scaling_stages_small.jsonl",
                                          "reader_scaling_vcpu_small.jsonl"], kept
        before = {p: p.read_bytes() for p in kept}
        run_script(path, tmp_path)
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
    if path.stem == "restore":
        # Every source this host runs, with every policy, each run verified.
        assert "24 runs, every one verified" in out, out[-2000:]
        table = out[out.index("faults_avoided"):]
        for name in ("file", "remote 30 us", "remote 200 us", "readahead", "background",
                     "replay"):
            assert name in table, name


@pytest.mark.kvm
def test_restore_runs_where_the_temporary_directory_is_tmpfs(kvm, tmp_path):
    """On tmpfs a snapshot's page cache cannot be dropped, so the cold file
    is not a source there: the notebook goes on with the page server."""
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
