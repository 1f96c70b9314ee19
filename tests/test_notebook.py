"""The Python API in a real Jupyter kernel: the example notebook runs top to bottom, and an
interrupted run(...) cell stops its processes, keeps the kernel and resumes bit for bit
(slow tier: Flower runs)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, SCOPE_VARIABLE, processes_in_scope

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

pytestmark = pytest.mark.slow

NOTEBOOK = REPO / "examples" / "notebooks" / "quickstart.ipynb"


def execute(notebook, folder: Path, scope: str, timeout_of=None):
    """Run every cell in a fresh kernel whose processes carry the test's scope; return the
    executed notebook (errors allowed only with ``timeout_of``, which interrupts a cell)."""
    import os

    client = nbclient.NotebookClient(
        notebook, kernel_name="python3", resources={"metadata": {"path": str(folder)}},
        timeout=600, timeout_func=timeout_of, interrupt_on_timeout=timeout_of is not None,
        allow_errors=timeout_of is not None,
    )
    previous = os.environ.get(SCOPE_VARIABLE)
    os.environ[SCOPE_VARIABLE] = scope  # the kernel, Flower and Ray inherit it
    try:
        return client.execute()
    finally:
        if previous is None:
            del os.environ[SCOPE_VARIABLE]
        else:
            os.environ[SCOPE_VARIABLE] = previous


def wait_for_no_processes(scope: str, seconds: float = 20.0) -> set[int]:
    deadline = time.monotonic() + seconds
    while (left := processes_in_scope(scope)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def test_the_quickstart_notebook_runs_top_to_bottom(tmp_path, scoped_env):
    _, scope = scoped_env
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")  # saved without outputs
    started = time.monotonic()
    executed = execute(notebook, tmp_path, scope)
    seconds = time.monotonic() - started
    code = [cell for cell in executed.cells if cell.cell_type == "code"]
    assert all(cell.execution_count for cell in code)
    assert not [o for cell in code for o in cell.outputs if o.output_type == "error"]
    final = code[-1].outputs[0]["data"]["text/plain"]
    assert [line.split()[0] for line in final.splitlines()[2:]] == ["FedAvg", "FedAvg+IMA", "FedAvg+WIMA"], final
    assert final.count("completed") == 3
    assert (tmp_path / "runs" / "quickstart" / "accuracy.png").is_file()
    assert (tmp_path / "runs" / "digits-alpha" / "results.parquet").is_file()
    assert not wait_for_no_processes(scope)
    print(f"notebook ran in {seconds:.0f} s")


INTERRUPTED = """
from experiments import run
from pathlib import Path
settings = dict(set={"num-rounds": 150, "checkpoint-every": 1}, progress=False)
"""
RUN = 'job = run(out="runs/interrupted", **settings)'
AFTER = """
import json
from experiments.runtime.reproducible import compare_runs
resumed = run(out="runs/interrupted", **settings)
whole = run(out="runs/whole", **settings)
comparison = compare_runs(Path("runs/interrupted"), Path("runs/whole"))
print(json.dumps({"identical": comparison.identical, "rounds": len(resumed.rounds)}))
"""


def test_an_interrupted_cell_stops_its_run_and_the_same_call_resumes_it(tmp_path, scoped_env):
    _, scope = scoped_env
    from nbformat.v4 import new_code_cell, new_notebook

    notebook = new_notebook(cells=[new_code_cell(INTERRUPTED), new_code_cell(RUN), new_code_cell(
        "import os, json\nprint(json.dumps({'pid': os.getpid()}))"), new_code_cell(AFTER)])

    def timeout_of(cell) -> int:  # the run's cell is interrupted after its first rounds
        return 25 if cell.source == RUN else 600

    executed = execute(notebook, tmp_path, scope, timeout_of)
    run_cell, alive, after = executed.cells[1], executed.cells[2], executed.cells[3]
    errors = [o.get("ename") for o in run_cell.outputs if o.output_type == "error"]
    assert errors == ["KeyboardInterrupt"], run_cell.outputs
    assert any("resume with: the same call with out=" in o.get("text", "") for o in run_cell.outputs)
    assert alive.outputs and "pid" in alive.outputs[0]["text"]  # the kernel survived the interrupt
    checkpoint = tmp_path / "runs" / "interrupted" / "results.csv"
    assert checkpoint.is_file()
    result = [o for o in after.outputs if o.output_type == "stream" and o.get("name") == "stdout"][-1]["text"]
    assert '"identical": true' in result and '"rounds": 150' in result, after.outputs
    assert not wait_for_no_processes(scope)
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)
