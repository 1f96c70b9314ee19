"""The Python API in a real Jupyter kernel: the example notebook runs top to bottom, and an
interrupted run(...) cell stops its processes, keeps the kernel and resumes bit for bit
(slow tier: Flower runs)."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, SCOPE_VARIABLE, processes_in_scope

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

pytestmark = pytest.mark.slow

NOTEBOOK = REPO / "examples" / "notebooks" / "quickstart.ipynb"


def execute(notebook, folder: Path, scope: str, interrupt_when: Callable[[], bool] | None = None):
    """Run every cell in a fresh kernel whose processes carry the test's scope; return the
    executed notebook. With ``interrupt_when``, the kernel is interrupted once, as Jupyter's
    interrupt button does it (SIGINT to the kernel's process group), as soon as that returns
    True, and errors are allowed."""
    client = nbclient.NotebookClient(
        notebook, kernel_name="python3", resources={"metadata": {"path": str(folder)}},
        timeout=600, allow_errors=interrupt_when is not None,
    )
    finished = threading.Event()

    def interrupt() -> None:  # a fixed time would not do: how far a run gets in it depends on the machine
        while not finished.wait(0.1):
            if interrupt_when():
                os.killpg(client.km.provisioner.pgid, signal.SIGINT)  # jupyter_client's LocalProvisioner.send_signal
                return

    if interrupt_when is not None:
        threading.Thread(target=interrupt, daemon=True).start()
    try:
        return client.execute(env={**os.environ, SCOPE_VARIABLE: scope})  # the kernel, Flower and Ray inherit it
    finally:
        finished.set()


def wait_for_no_processes(scope: str, seconds: float = 20.0) -> dict[int, str]:
    """The processes of ``scope`` still running after ``seconds``, with their command lines."""
    deadline = time.monotonic() + seconds
    while (left := processes_in_scope(scope)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return {pid: _command_line(pid) for pid in left}


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "(ended)"


@dataclass
class Executed:
    """A notebook run by ``notebooks``: the executed notebook, its folder and its processes' scope."""

    notebook: Any
    folder: Path
    scope: str
    seconds: float


def _executed(notebook, folder: Path, interrupt_when: Callable[[], bool] | None = None) -> Executed:
    scope = uuid.uuid4().hex
    started = time.monotonic()
    executed = execute(notebook, folder, scope, interrupt_when)
    return Executed(executed, folder, scope, time.monotonic() - started)


def test_the_quickstart_notebook_runs_top_to_bottom(notebooks):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")  # saved without outputs
    run = notebooks["quickstart"].result()
    executed, folder, scope, seconds = run.notebook, run.folder, run.scope, run.seconds
    code = [cell for cell in executed.cells if cell.cell_type == "code"]
    assert all(cell.execution_count for cell in code)
    assert not [o for cell in code for o in cell.outputs if o.output_type == "error"]
    final = code[-1].outputs[0]["data"]["text/plain"]
    assert [line.split()[0] for line in final.splitlines()[2:]] == ["FedAvg", "FedAvg+IMA", "FedAvg+WIMA"], final
    assert final.count("completed") == 3
    assert (folder / "runs" / "quickstart" / "accuracy.png").is_file()
    assert (folder / "runs" / "digits-alpha" / "results.parquet").is_file()
    costs = next(cell for cell in code if "reproduce(" in cell.source).outputs
    assert any("cells run match the paper" in o.get("text", "") for o in costs)  # the headline
    shown = next(o["data"]["text/plain"] for o in costs if o.output_type == "execute_result")
    assert "MFLOPs" in shown and "Param (M)" in shown and "not run" not in shown.split("MFLOPs")[1].splitlines()[0]
    assert (folder / "runs" / "fedalign-table5" / "report.md").is_file()
    assert not wait_for_no_processes(scope)
    print(f"notebook ran in {seconds:.0f} s")


# 24 rounds of ~0.25 s (4 epochs of batches of 4; 2 cores): interrupted after its third, the
# run has ~5 s left, 50 times the interrupt's 0.1 s poll (60 rounds cost ~20 s more: two runs
# here and the whole one). One client a round: each of the kernel's two runs starts one
# client process (its start is a run's largest cost after Flower's own).
ROUNDS = 24
SETTINGS = {"num-clients": 4, "participation": 0.25, "num-rounds": ROUNDS, "local-epochs": 4, "batch-size": 4,
            "checkpoint-every": 1}
# The whole run that the resumed one is compared with, launched with the session's other
# reference runs (tests/conftest.py) instead of in the kernel with its own Ray.
FLOWER_RUNS = {"notebook-whole": SETTINGS}
INTERRUPTED = f"""
from experiments.api import run
from pathlib import Path
settings = dict(set={SETTINGS!r}, progress=False)
"""
RUN = 'job = run(out="runs/interrupted", **settings)'
AFTER = """
import json
from experiments.runtime.reproducible import compare_runs
resumed = run(out="runs/interrupted", **settings)
comparison = compare_runs(Path("runs/interrupted"), Path({whole!r}))
print(json.dumps({{"identical": comparison.identical, "rounds": len(resumed.rounds)}}))
"""


def _interrupted(whole: str, folder: Path) -> Executed:
    """The kernel's run interrupted once after its first rounds, then the same call again."""
    from nbformat.v4 import new_code_cell, new_notebook

    notebook = new_notebook(cells=[new_code_cell(INTERRUPTED), new_code_cell(RUN), new_code_cell(
        "import os, json\nprint(json.dumps({'pid': os.getpid()}))"), new_code_cell(AFTER.format(whole=whole))])
    checkpoint = folder / "runs" / "interrupted" / "results.csv"

    def after_its_first_rounds() -> bool:  # the run's cell is interrupted then
        try:
            return len(checkpoint.read_text().splitlines()) > 3  # a header and 3 rounds
        except OSError:
            return False

    return _executed(notebook, folder, after_its_first_rounds)


@pytest.fixture(scope="module")
def notebooks(flower_runs, tmp_path_factory) -> dict[str, Future]:
    """Both notebooks at once, each in a kernel of its own: one alone left a third to a half
    of 2 cores idle (the kernel's and its runs' start-up)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        quickstart = pool.submit(_executed, nbformat.read(NOTEBOOK, as_version=4), tmp_path_factory.mktemp("quickstart"))
        whole = flower_runs["notebook-whole"]
        interrupted = pool.submit(lambda: _interrupted(str(whole.completed()), tmp_path_factory.mktemp("interrupted")))
        return {"quickstart": quickstart, "interrupted": interrupted}


@pytest.mark.flower_runs("notebook-whole")
def test_an_interrupted_cell_stops_its_run_and_the_same_call_resumes_it(notebooks):
    run = notebooks["interrupted"].result()
    executed, scope = run.notebook, run.scope
    checkpoint = run.folder / "runs" / "interrupted" / "results.csv"
    run_cell, alive, after = executed.cells[1], executed.cells[2], executed.cells[3]
    errors = [o.get("ename") for o in run_cell.outputs if o.output_type == "error"]
    assert errors == ["KeyboardInterrupt"], run_cell.outputs
    assert any("resume with: the same call with out=" in o.get("text", "") for o in run_cell.outputs)
    assert alive.outputs and "pid" in alive.outputs[0]["text"]  # the kernel survived the interrupt
    assert checkpoint.is_file()
    result = [o for o in after.outputs if o.output_type == "stream" and o.get("name") == "stdout"][-1]["text"]
    assert '"identical": true' in result and f'"rounds": {ROUNDS}' in result, after.outputs
    assert not wait_for_no_processes(scope)
    shutil.rmtree(run.folder / "runs", ignore_errors=True)
