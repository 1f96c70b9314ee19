"""Experiment trackers (strategies/tracking.py): a real run logged to TensorBoard, MLflow
and W&B (offline), read back with each tool's own reader and compared with results.csv;
a tracker that fails is one warning, never a failed run. The same run, launched from the
command line with its output in a file, shows the progress written there."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest

from experiments.runtime.machine import check_trackers
from experiments.runtime.run_config import resolve_config, tracked_in
from strategies.config import ConfigError
from strategies.results import RunRecorder
from strategies.tracking import TRACKER_CLASSES, Trackers

ROUNDS = 3


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory) -> Path:
    """The run's folder; beside it, ``left-in-tmp.json``: what the run left in the temporary folder."""
    out = tmp_path_factory.mktemp("tracked") / "run"
    log = out.parent / "stderr.log"
    before = _temporary_entries()
    with open(log, "w") as stderr:  # output to a file, as under nohup or a cluster job
        result = subprocess.run(
            [sys.executable, "-m", "experiments.run", "--set", f"num-rounds={ROUNDS}", "--set", "num-clients=4",
             "--set", "local-epochs=1", "--track", "tensorboard,mlflow,wandb", "--out", str(out)],
            stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=600,
        )
    assert result.returncode == 0, log.read_text()[-3000:]
    (out.parent / "left-in-tmp.json").write_text(json.dumps(sorted(_temporary_entries() - before)))
    return out


def _temporary_entries() -> set[str]:
    """The temporary folder's entries, but Ray's (its session folders: tests/conftest.py's check)."""
    return {path.name for path in Path(tempfile.gettempdir()).iterdir()} - {"ray"}


def _results(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "results.csv")


@pytest.mark.slow
def test_a_run_with_its_output_in_a_file_writes_a_few_whole_lines(tracked_run):
    """Progress (experiments/runtime/progress.py) in a real run launched from the command
    line with its output in a file: no redraws, and a few whole lines."""
    text = (tracked_run.parent / "stderr.log").read_text()
    assert "\r" not in text
    lines = [line for line in text.splitlines() if f" 0/{ROUNDS} " in line or f"/{ROUNDS} [" in line]
    # the first line, one per start-up stage (7 at most), the rounds (at most one per round) and the end
    assert 2 <= len(lines) <= 12, text
    assert lines[-1].split(":")[1].strip().startswith(f"100% {ROUNDS}/{ROUNDS}")


@pytest.mark.slow
def test_tensorboard_holds_every_round_the_config_and_the_figures(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (folder,) = (tracked_run / "tensorboard").iterdir()
    events = EventAccumulator(str(folder), size_guidance={"images": 0})
    events.Reload()
    logged = events.Scalars("test-accuracy")
    assert [e.step for e in logged] == list(range(1, ROUNDS + 1))
    assert [e.value for e in logged] == pytest.approx(_results(tracked_run)["test-accuracy"].tolist(), rel=1e-6)
    assert "figures/partition" in events.Tags()["images"]
    assert events.Scalars("summary/acc-final")[0].value == pytest.approx(
        json.loads((tracked_run / "summary.json").read_text())["acc-final"], rel=1e-6)


@pytest.mark.slow
def test_mlflow_holds_the_config_every_round_and_the_figures(tracked_run, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # as Basin's tracker does for its local file store
    client = MlflowClient((tracked_run / "mlruns").resolve().as_uri())
    (experiment,) = [e for e in client.search_experiments() if e.name != "Default"]  # the job's group
    (run,) = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(run.info.run_id, "test-accuracy")
    assert [m.step for m in history] == list(range(1, ROUNDS + 1))
    assert [m.value for m in history] == _results(tracked_run)["test-accuracy"].tolist()
    config = json.loads((tracked_run / "config.json").read_text())
    assert run.data.params["num-rounds"] == str(ROUNDS) and set(run.data.params) == set(config)
    assert run.info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(run.info.run_id, "figures")] == ["figures/partition.png"]


@pytest.mark.slow
def test_wandb_keeps_an_offline_run_with_every_round(tracked_run):
    (folder,) = (tracked_run / "wandb").glob("offline-run-*")
    (log,) = folder.glob("run-*.wandb")
    records = subprocess.run([str(Path(sys.executable).parent / "wandb"), "leet", "inspect", "--json", str(log)],
                             capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL).stdout  # W&B's reader
    history = [json.loads(line)["history"]["item"] for line in records.splitlines() if '"type":"history"' in line]
    rounds = [item for item in history if "test-accuracy" in item]
    assert [item["_step"] for item in rounds] == list(range(1, ROUNDS + 1))
    assert [item["test-accuracy"] for item in rounds] == _results(tracked_run)["test-accuracy"].tolist()
    assert any(item.get("figures/partition._type") == "image-file" for item in history)  # the figure, with the last round


@pytest.mark.slow
def test_a_tracked_run_leaves_nothing_in_the_temporary_folder(tracked_run):
    """W&B's service socket folder and the folders wandb makes on import went only at a
    normal exit, and the launcher stops the ServerApp's process: three folders a run."""
    assert json.loads((tracked_run.parent / "left-in-tmp.json").read_text()) == []


def test_a_failing_tracker_is_one_warning_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    class DiskFull(TRACKER_CLASSES["tensorboard"]):
        def __init__(self, *args):
            pass

        def log_round(self, server_round, row):
            raise OSError(28, "No space left on device")

    monkeypatch.setitem(TRACKER_CLASSES, "tensorboard", DiskFull)
    config = resolve_config({"track": "tensorboard"})
    recorder = RunRecorder(tmp_path, config, 10, 0.9, trackers=Trackers(config, tmp_path))
    for r in (1, 2):
        recorder.append({"round": r, "test-accuracy": 0.5})
    summary = recorder.complete()
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning: tracker" in line]
    assert warnings == ["[basin] warning: tracker tensorboard stopped: OSError: [Errno 28] No space left on device; "
                        "the run goes on"]
    assert summary["status"] == "completed" and len(pd.read_csv(tmp_path / "results.csv")) == 2


def test_a_missing_tracker_library_is_refused_before_flower_starts(monkeypatch):
    import importlib.machinery
    import importlib.util

    # tensorboard installed (as the tracking extra has it; the test extra alone has none), mlflow not
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else
                        importlib.machinery.ModuleSpec(name, None) if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError, match=r"asks for mlflow, which is not installed; install the optional extra: .*"
                                          r"pip install -e \"\.\[tracking\]\""):
        check_trackers([resolve_config({"track": "tensorboard,mlflow"})])
    with pytest.raises(ConfigError, match="run config key 'track' = 'tensorbord' is not allowed"):
        resolve_config({"track": "tensorbord"})


def test_a_jobs_runs_are_one_group_unless_the_config_names_its_own(tmp_path):
    grouped = tracked_in(resolve_config({"track": "mlflow"}), tmp_path, "my-sweep")
    assert (grouped["track-dir"], grouped["track-group"]) == (str(tmp_path), "my-sweep")
    own = tracked_in(resolve_config({"track": "mlflow", "track-group": "mine"}), tmp_path, "my-sweep")
    assert own["track-group"] == "mine"
    assert tracked_in(resolve_config({}), tmp_path, "my-sweep")["track-dir"] == ""  # nothing tracked
