"""Experiment trackers: a run's config, its rounds as they happen, its summary and figures
in TensorBoard, MLflow or Weights & Biases (run-config key ``track``).

The ServerApp feeds them from the place ``results.csv`` is written
(strategies/results.RunRecorder), once per round. Each works offline:

- ``tensorboard``: event files in ``<track-dir>/tensorboard/<run>``; the config as
  hyper-parameters (the HParams tab), each round's numbers as scalars, the figures as images;
- ``mlflow``: the tracking URI the user set (``MLFLOW_TRACKING_URI``), else a file store in
  ``<track-dir>/mlruns`` (MLflow 3 keeps file stores in maintenance; Basin allows it with
  ``MLFLOW_ALLOW_FILE_STORE``, as MLflow says; the extra installs mlflow-skinny, which has no
  SQLite store and no UI: ``pip install mlflow`` for ``mlflow ui``); one experiment per group, the config as parameters, each round's
  numbers as metrics (step = round), the summary's numbers as metrics, figures as artifacts;
- ``wandb``: offline (``<track-dir>/wandb``) unless the user configured W&B (``WANDB_MODE``,
  or ``WANDB_API_KEY`` set: online); project ``WANDB_PROJECT`` or "basin", group = the group.

``track-dir`` defaults to the run's output folder, ``track-group`` to that folder's name;
the launcher sets both for a comparison or a sweep, so its runs are grouped (one
TensorBoard folder, one MLflow experiment, one W&B group). The libraries are the optional
extra ``tracking`` (``pip install -e ".[tracking]"``) and are imported only when asked for.
A tracker that fails (missing library, full disk, bad URI) prints one warning and is
dropped: tracking never fails a run.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clients.log import log

TRACKERS = ("tensorboard", "mlflow", "wandb")
WANDB_DEFAULT_PROJECT = "basin"


def tracker_names(value: str) -> list[str]:
    """The trackers a ``track`` value names ("" = none), in order, each once."""
    return list(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))


def _numbers(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a results row or summary (not bools, texts or NaN)."""
    return {key: float(value) for key, value in row.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}


class Tracker:
    """One tracker's run, opened with the run's directory, group, name and config:
    :meth:`log_round` once per round, :meth:`finish` at the end."""

    def __init__(self, directory: Path, group: str, run_name: str, config: Mapping[str, Any]):
        raise NotImplementedError

    def log_round(self, server_round: int, row: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def finish(self, summary: Mapping[str, Any], figures: list[Path]) -> None:
        raise NotImplementedError


class TensorBoardTracker(Tracker):
    def __init__(self, directory: Path, group: str, run_name: str, config: Mapping[str, Any]):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.writer = SummaryWriter(log_dir=str(directory / "tensorboard" / run_name))
        # The HParams tab: this run's config, against its test accuracy (in the same folder).
        file_writer = self.writer.file_writer
        assert file_writer is not None  # SummaryWriter opens it
        for summary in hparams(dict(config), {"test-accuracy": 0.0}):
            file_writer.add_summary(summary)

    def log_round(self, server_round: int, row: Mapping[str, Any]) -> None:
        for key, value in _numbers(row).items():
            self.writer.add_scalar(key, value, server_round)
        self.writer.flush()

    def finish(self, summary: Mapping[str, Any], figures: list[Path]) -> None:
        from matplotlib import image

        for key, value in _numbers(summary).items():
            self.writer.add_scalar(f"summary/{key}", value, 0)
        for figure in figures:
            self.writer.add_image(f"figures/{figure.stem}", image.imread(figure)[..., :3], 0, dataformats="HWC")
        self.writer.close()


class MlflowTracker(Tracker):
    def __init__(self, directory: Path, group: str, run_name: str, config: Mapping[str, Any]):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # a local file store: MLflow 3 keeps it working, in maintenance, when allowed
            uri = (directory / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(group)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(group)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        params = [Param(key, str(value)) for key, value in config.items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 parameters per batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def log_round(self, server_round: int, row: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(1000 * time.time())
        metrics = [Metric(key, value, now, server_round) for key, value in _numbers(row).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, summary: Mapping[str, Any], figures: list[Path]) -> None:
        for key, value in _numbers(summary).items():
            self.client.log_metric(self.run_id, f"summary.{key}", value)
        for figure in figures:
            self.client.log_artifact(self.run_id, str(figure), "figures")
        self.client.set_terminated(self.run_id, "FINISHED" if summary.get("status") == "completed" else "FAILED")


class WandbTracker(Tracker):
    def __init__(self, directory: Path, group: str, run_name: str, config: Mapping[str, Any]):
        import wandb

        configured = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        directory.mkdir(parents=True, exist_ok=True)
        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", WANDB_DEFAULT_PROJECT), group=group,
                              name=run_name, dir=str(directory), config=dict(config), mode=configured,  # type: ignore[arg-type]
                              settings=wandb.Settings(console="off", silent=True))

    def log_round(self, server_round: int, row: Mapping[str, Any]) -> None:
        self.run.log(_numbers(row), step=server_round)
        self.last_round = server_round

    def finish(self, summary: Mapping[str, Any], figures: list[Path]) -> None:
        self.run.summary.update({f"summary/{key}": value for key, value in _numbers(summary).items()})
        if figures:  # with the last round (W&B steps only grow)
            self.run.log({f"figures/{figure.stem}": self.wandb.Image(str(figure)) for figure in figures},
                         step=getattr(self, "last_round", 0))
        self.run.finish(exit_code=0 if summary.get("status") == "completed" else 1)
        # W&B's service removes its socket folder, and wandb the folders it makes in the
        # temporary folder on import, only when the process exits normally; the launcher stops
        # the ServerApp's process once the run is over, which left three folders a run in /tmp.
        self.wandb.teardown()
        with contextlib.suppress(ImportError, AttributeError):  # where a wandb release moves them: left
            from wandb.sdk.artifacts.artifact import Artifact
            from wandb.sdk.data_types._private import MEDIA_TMP

            for folder in (MEDIA_TMP, Artifact._TMP_DIR):
                folder.cleanup()


TRACKER_CLASSES: dict[str, type[Tracker]] = {
    "tensorboard": TensorBoardTracker, "mlflow": MlflowTracker, "wandb": WandbTracker,
}


class Trackers:
    """The trackers a run config asks for; a tracker that fails warns once and is dropped."""

    def __init__(self, config: Mapping[str, Any], output_dir: Path):
        directory = Path(config["track-dir"] or output_dir)
        group = config["track-group"] or Path(output_dir).name
        run_name = Path(output_dir).name
        self.active: dict[str, Tracker] = {}
        for name in tracker_names(config["track"]):
            self._guarded(name, lambda: self.active.__setitem__(
                name, TRACKER_CLASSES[name](directory, group, run_name, config)))

    def _guarded(self, name: str, action) -> None:
        try:
            action()
        except Exception as error:  # tracking must never fail the run
            self.active.pop(name, None)
            hint = '; install it with pip install -e ".[tracking]"' if isinstance(error, ImportError) else ""
            detail = traceback.format_exception_only(type(error), error)[-1].strip()
            log.warning(f"warning: tracker {name} stopped: {detail}{hint}; the run goes on")

    def log_round(self, row: Mapping[str, Any]) -> None:
        for name, tracker in list(self.active.items()):
            self._guarded(name, lambda: tracker.log_round(int(row["round"]), row))

    def finish(self, summary: Mapping[str, Any], figures: list[Path]) -> None:
        for name, tracker in list(self.active.items()):
            self._guarded(name, lambda: tracker.finish(summary, [f for f in figures if f.exists()]))
        self.active.clear()
