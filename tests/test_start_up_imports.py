"""What each of a run's processes imports before it needs it, each import checked in a fresh
Python: the launcher's checks, the ServerApp's module and the client processes load no
heavy package (torch, pandas, flwr-datasets, Flower's simulation package) they do not use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_launchers_checks_load_no_flwr_datasets_and_the_partition_check_no_torch():
    """What the launcher runs before Flower starts (the main job's configs, their data,
    partition and machine checks) imports no flwr-datasets (3-4 s: Hugging Face datasets,
    seaborn, SciPy), and the partition check's labels come without torch."""
    code = (
        "import sys\n"
        "from partitions.feasibility import partition_labels\n"
        "assert len(partition_labels('digits', '')) > 1000\n"
        "print(sorted(m for m in ('torch', 'flwr_datasets', 'datasets') if m in sys.modules))\n"
        "from experiments.api import MAIN_JOB_COMPARE, grid\n"
        "from experiments.runtime.machine import check_data, check_machine, client_resources\n"
        "from experiments.runtime.run_config import resolve_config\n"
        "runs = [resolve_config({}, {}, point) for point in grid(MAIN_JOB_COMPARE)]\n"
        "check_data(runs)\n"
        "check_machine(runs, client_resources(runs, 1.0, None, ray_address=None), None)\n"
        "print(sorted(m for m in ('flwr_datasets', 'datasets') if m in sys.modules))\n"
    )
    assert _printed_lines_of_a_fresh_python(code)[-2:] == ["[]", "[]"]


def test_the_launcher_and_the_serverapp_load_no_pandas_before_their_first_round():
    """pandas (0.4-0.9 s on 2 cores) is for the tables: the launcher's modules up to
    Flower's start and the ServerApp's work module do not import it (the class-count table
    imports it beside the rounds, the summary table after them)."""
    code = (
        "import sys\n"
        "import experiments.api, experiments.run\n"
        "from experiments.runtime import finished_runs, job_folders, launch, machine, mps, output_dir, ray_cluster\n"
        "from experiments.runtime import run_config, run_endings, sweep_definition\n"
        "import strategies.checkpoint, strategies.server_work\n"
        "print('pandas' in sys.modules)\n"
    )
    assert _printed_lines_of_a_fresh_python(code)[-1] == "False"


def _printed_lines_of_a_fresh_python(code: str) -> list[str]:
    """The lines ``code`` prints, run by a new Python in the repository (what it imports is its own)."""
    import subprocess
    import sys
    from pathlib import Path

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip().splitlines()


def test_a_client_process_loads_the_client_actor_without_flowers_simulation_package():
    """Ray imports the actor's module in each client process: Flower's own actor module
    brings flwr.simulation (its runner and CLI, ~1 s of CPU per process); Basin's copy only
    Ray and the ClientApp, and it runs a ClientApp as Flower's actor does."""
    code = ("import sys\n"
            "from clients.client_actor import ClientAppActor\n"
            "actor = ClientAppActor()\n"
            "app = lambda message, context: ('reply to', message)\n"
            "print(actor.run(lambda: app, 'message', '7', 'context'))\n"
            "print(sorted(name for name in sys.modules if name.split('.')[:2] in (['flwr', 'simulation'], ['flwr', 'cli'])\n"
            "             or name.startswith('torch')))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["('7', ('reply to', 'message'), 'context')", "[]"]


def test_the_server_app_module_loads_without_torch():
    """Flower loads the ServerApp, then the ClientApp, under one lock, and starts Ray after
    both: the ServerApp module's own imports must not hold the ClientApp and Ray back."""
    import subprocess
    from pathlib import Path

    code = "import sys, strategies.server_app, strategies.client_app\nprint('torch' in sys.modules)\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False"
