"""The notebooks in notebooks/: committed without outputs, and each one runs
from top to bottom at UFFDKVM_NB_SCALE=small without a cell error.

Each notebook is executed in memory (its file is never written) by a kernel
of this very Python, from a temporary working directory (whatever a notebook
writes lands there), with the uffdkvm these tests import first on its path:
a worktree's own uffdkvm, not whichever one is installed.
"""
import json
import os
import sys
import time
from pathlib import Path

import pytest

import uffdkvm

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
KERNEL = "uffdkvm-tests"  # a kernel spec of our own, so no other "python3" is picked up
SMALL_RUN_S = 60          # each takes well under 20 s here; this catches a runaway


def ids(paths):
    return [p.stem for p in paths]


def test_the_notebooks_are_there():
    assert {p.stem for p in NOTEBOOKS} >= {"reader_scaling", "latency", "backing_sources"}


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
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"uffdkvm tests ({sys.executable})",
        "language": "python",
    }))
    monkeypatch_module.setenv("JUPYTER_PATH", str(data))
    package_root = str(Path(uffdkvm.__file__).resolve().parent.parent)
    monkeypatch_module.setenv("PYTHONPATH", os.pathsep.join(
        [package_root, *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch_module.setenv("UFFDKVM_NB_SCALE", "small")
    monkeypatch_module.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch_module.delenv("UFFDKVM_NB_HUGEPAGES", raising=False)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.mark.kvm
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
