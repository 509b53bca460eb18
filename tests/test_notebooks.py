"""The notebooks in notebooks/: committed clean, and each one runs top to bottom in a fresh kernel.

Execution uses nbclient with a fresh kernel of *this* interpreter (the venv's python): a
throw-away kernelspec whose argv is ``sys.executable -m ipykernel_launcher``, found through a
kernel manager that looks only in that spec's directory. So a ``python3`` kernelspec elsewhere
(``~/.local/share/jupyter``, ``/usr/share/jupyter``: another Python, perhaps without arl) is
never picked up, and nothing is installed outside the test's temporary directory. The kernel
runs in notebooks/ (as when a user opens them there) and writes its runs to temporary
directories. Top-level ``await`` works as in Jupyter: ipykernel runs an asyncio loop.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
EXPECTED = ["01_quickstart", "02_gigpo_vs_grpo", "03_env_manager_benchmark", "04_custom_agent"]
KERNEL_NAME = "arl-test-venv"


def _id(path: Path) -> str:
    return path.stem


def test_the_notebooks_are_there():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_id)
def test_committed_clean(path):
    """No outputs or execution counts in the repository; the first cell says what the notebook
    shows, how long it takes on CPU and what to change for a GPU; no event-loop workarounds."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {i} has outputs: clear them before committing"
            assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"
            assert not re.search(r"asyncio\.run\(|nest_asyncio|get_event_loop\(\)\.run_until", cell.source), (
                f"{path.name} cell {i}: Jupyter already runs an event loop, use top-level await")
    first = nb.cells[0]
    assert first.cell_type == "markdown"
    for phrase in ("**What it shows.**", "**Time.**", "**On a GPU.**"):
        assert phrase in first.source, f"{path.name}: first cell lacks {phrase}"


@pytest.fixture(scope="module")
def kernel_manager_class(tmp_path_factory):
    """An AsyncKernelManager that knows exactly one kernelspec: this interpreter."""
    from jupyter_client import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpecManager
    from traitlets import default

    kernels = tmp_path_factory.mktemp("kernels")
    spec_dir = kernels / KERNEL_NAME
    spec_dir.mkdir()
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"arl tests ({sys.executable})",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))

    class VenvKernelManager(AsyncKernelManager):
        @default("kernel_spec_manager")
        def _kernel_spec_manager_default(self):
            return KernelSpecManager(kernel_dirs=[str(kernels)])

    return VenvKernelManager


CHECK_KERNEL = (
    "import sys as _sys\n"
    "print('ARL-KERNEL', _sys.executable, _sys.prefix, sep='\\n')"
)


@pytest.mark.slow
@pytest.mark.vllm  # every notebook starts the in-process vLLM engine (03 for its real-engine section)
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_id)
def test_notebook_runs(path, kernel_manager_class, capsys):
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(CHECK_KERNEL))  # in memory only: the file is untouched
    client = NotebookClient(
        nb, kernel_name=KERNEL_NAME, kernel_manager_class=kernel_manager_class, timeout=600,
        shutdown_kernel="immediate", resources={"metadata": {"path": str(NOTEBOOKS_DIR)}},
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError (with the traceback) on the first failing cell
    elapsed = time.perf_counter() - start

    out = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.get("name") == "stdout")
    _, executable, prefix = out.strip().splitlines()[-3:]
    assert (executable, prefix) == (sys.executable, sys.prefix), "the kernel is not this interpreter"
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    with capsys.disabled():
        print(f"\n{path.name}: executed in {elapsed:.0f} s")
