"""The Python API's contract without Flower (experiments/api.py): bad input raises the
command line's one-line errors as exceptions before anything starts, never SystemExit, and
finished folders read back into the same objects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from experiments import api
from experiments.runtime.cli import UsageError
from experiments.runtime.job_folders import label_of
from strategies.config import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_the_api_is_plain_functions_in_a_plain_python():
    code = ("from experiments.api import run, sweep, reproduce, load_run; import inspect, types; "
            "print(all(isinstance(f, types.FunctionType) for f in (run, sweep, reproduce, load_run)), "
            "list(inspect.signature(run).parameters)[:3])")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True ['preset', 'set', 'compare']"


def _readme_python_example() -> str:
    readme = (REPO / "README.md").read_text()
    start = readme.index("```python\n", readme.index("**From Python or a notebook**")) + len("```python\n")
    return readme[start:readme.index("```", start)]


# mypy follows Basin's packages only: the rest (torch, pandas, Flower, the trackers) does not
# change what `run` is, and following it all took ~30 s instead of ~2.
USER_MYPY_CONFIG = """[mypy]
follow_imports = skip
ignore_missing_imports = True
incremental = False
[mypy-clients,clients.*,experiments,experiments.*,partitions,partitions.*,strategies,strategies.*]
follow_imports = silent
"""


def test_the_readmes_python_example_type_checks_as_a_users_file(tmp_path):
    """A researcher's type checker sees ``run(...) -> Job`` (the package's ``run`` was the
    command-line module with its class swapped: "Module not callable")."""
    user = tmp_path / "user.py"
    user.write_text(_readme_python_example() + "reveal_type(run)\nreveal_type(job)\njob.summary.head()\n")
    (tmp_path / "mypy.ini").write_text(USER_MYPY_CONFIG)
    done = subprocess.run([str(Path(sys.executable).parent / "mypy"), "--config-file", "mypy.ini", str(user)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "MYPYPATH": str(REPO)})
    assert done.returncode == 0, done.stdout
    assert "-> experiments.job_results.Job" in done.stdout and 'Revealed type is "experiments.job_results.Job"' in done.stdout


@pytest.mark.parametrize("call, error, message", [
    (lambda out: api.run(set={"lr": -1.0}, out=out), ConfigError, "'lr'"),
    (lambda out: api.run(preset="no-such-preset", out=out), FileNotFoundError, "preset 'no-such-preset' not found"),
    (lambda out: api.run(compare={"averaging": "ima"}, out=out), UsageError, "compare['averaging']"),
    (lambda out: api.run(set={"dataset": "fashion-mnist", "data-dir": "/nowhere"}, out=out), ValueError, "does not exist"),
    # Two runs of one folder: the second's results would overwrite the first's.
    (lambda out: api.run(compare={"lr": [0.1, 0.1]}, out=out), UsageError, "gives two runs the same folder '0.1'"),
    (lambda out: api.sweep("no-such-sweep", out=out), FileNotFoundError, "sweep 'no-such-sweep' not found"),
    (lambda out: api.sweep("ima-fmnist-alpha", out=out, parallel=0), UsageError, "parallel = 0"),
])
def test_bad_input_raises_before_anything_starts(tmp_path, call, error, message):
    out = tmp_path / "out"
    with pytest.raises(error) as raised:
        call(out)
    assert message in str(raised.value) and "\n" not in str(raised.value).strip()
    assert not out.exists()  # nothing was created: Flower never started


def fake_run_folder(folder: Path, config: dict, accuracies: list[float]) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    # An earlier release's names: client-gpu-mb (MiB all along), last-K-accuracy, …
    pd.DataFrame({"round": range(1, len(accuracies) + 1), "test-accuracy": accuracies,
                  "client-gpu-mb": [float("nan")] * len(accuracies)}).to_csv(folder / "results.csv", index=False)
    (folder / "summary.json").write_text(json.dumps({
        "status": "completed", "last-k": 2, "last-2-accuracy": sum(accuracies[-2:]) / 2,
        "best-accuracy": max(accuracies), "final-accuracy": accuracies[-1], "rounds": len(accuracies)}))


def test_load_run_reads_a_job_folder_in_its_order(tmp_path):
    from experiments.runtime.run_config import resolve_config

    job_dir = tmp_path / "job"
    base = resolve_config({"num-rounds": 3})
    fake_run_folder(job_dir / "none", {**base, "averaging": "none"}, [0.5, 0.6, 0.7])
    fake_run_folder(job_dir / "ima", {**base, "averaging": "ima"}, [0.5, 0.7, 0.9])
    pd.DataFrame({"run": ["FedAvg", "FedAvg+IMA"]}).to_csv(job_dir / "summary.csv", index=False)
    job = api.load_run(job_dir)
    assert list(job.runs) == ["FedAvg", "FedAvg+IMA"]
    assert job.summary.loc["FedAvg+IMA", "acc-last-k"] == pytest.approx(0.8)
    assert job.summary["status"].tolist() == ["completed", "completed"]
    rounds = job.rounds
    assert list(rounds.columns[:2]) == ["run", "round"] and len(rounds) == 6
    assert "client-gpu-mib" in rounds and "client-gpu-mb" not in rounds  # read under today's name
    assert rounds[rounds["run"] == "FedAvg"]["test-accuracy"].tolist() == [0.5, 0.6, 0.7]
    assert job.configs["FedAvg+IMA"]["averaging"] == "ima"
    single = api.load_run(job_dir / "ima")
    assert list(single.runs) == ["FedAvg+IMA"] and single.figure is None
    with pytest.raises(FileNotFoundError, match="holds no Basin run"):
        api.load_run(tmp_path)
    with pytest.raises(FileNotFoundError, match="not found"):
        api.load_run(tmp_path / "missing")


def test_load_run_reads_a_sweep_folder(tmp_path):
    folder = tmp_path / "sweep"
    (folder / "runs" / "seed=0").mkdir(parents=True)
    pd.DataFrame({"run": ["seed=0"], "status": ["completed"], "acc-last-k": [0.8]}).to_parquet(folder / "results.parquet")
    pd.DataFrame({"run": ["seed=0"], "round": [1]}).to_parquet(folder / "curves.parquet")
    result = api.load_run(folder)
    assert isinstance(result, api.SweepResult) and list(result.runs) == ["seed=0"]
    assert result.table["acc-last-k"].tolist() == [0.8] and len(result.curves) == 1


def test_the_compare_grid_and_labels():
    points = api.grid({"strategy": ["fedavg", "fedprox"], "averaging": ["none", "ima"]})
    assert [label_of(p) for p in points] == ["fedavg-none", "fedavg-ima", "fedprox-none", "fedprox-ima"]
