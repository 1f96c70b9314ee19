"""What a job, a sweep and a run folder are in Python: :class:`Job` and :class:`SweepResult`,
their tables read from their files each time, and :func:`load_run`, a finished (or
interrupted) folder back as the object that wrote it. experiments/api.py returns them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Job:
    """A job's output folder and its runs; the tables are read from the files each time."""

    out: Path
    runs: dict[str, Path]  # run label ("FedAvg+IMA") → its folder

    @property
    def rounds(self) -> pd.DataFrame:
        """One row per (run, round): ``run`` and every column of the runs' results.csv."""
        import pandas as pd

        from strategies.results import RENAMED_ROUND_COLUMNS

        frames = [pd.read_csv(folder / "results.csv").rename(columns=RENAMED_ROUND_COLUMNS).assign(run=label)
                  for label, folder in self.runs.items() if (folder / "results.csv").is_file()]
        if not frames:
            return pd.DataFrame(columns=["run", "round"])
        table = pd.concat(frames, ignore_index=True)
        return table[["run", *[c for c in table.columns if c != "run"]]]

    @property
    def client_evaluation(self) -> pd.DataFrame:
        """With ``client-evaluation`` > 0: one row per (run, round, client), the received model
        on that client's held-out split: ``run``, round, partition, node, examples, accuracy
        (a fraction), loss (the runs' client-evaluation.csv)."""
        import pandas as pd

        from strategies.results import CLIENT_EVALUATION_COLUMNS, CLIENT_EVALUATION_FILE

        frames = [pd.read_csv(folder / CLIENT_EVALUATION_FILE).assign(run=label) for label, folder in self.runs.items()
                  if (folder / CLIENT_EVALUATION_FILE).is_file()]
        if not frames:
            return pd.DataFrame(columns=["run", *CLIENT_EVALUATION_COLUMNS])
        table = pd.concat(frames, ignore_index=True)
        return table[["run", *CLIENT_EVALUATION_COLUMNS]]

    @property
    def summary(self) -> pd.DataFrame:
        """One row per run (index ``run``): status, acc-last-k, k, best and final accuracy,
        round reaching the target, rounds, seconds, as the command line's table."""
        from experiments.runtime.finished_runs import summary_table

        summaries = {label: read_json(folder / "summary.json") for label, folder in self.runs.items()}
        table = summary_table(summaries)
        table.insert(0, "status", [s.get("status", "not started") for s in summaries.values()])
        return table

    @property
    def configs(self) -> dict[str, dict[str, Any]]:
        """Each run's resolved run config (its config.json)."""
        return {label: read_json(folder / "config.json") for label, folder in self.runs.items()}

    @property
    def figure(self) -> Path | None:
        """The job's accuracy figure (accuracy.png), when written."""
        path = self.out / "accuracy.png"
        return path if path.is_file() else None

    def _repr_html_(self) -> str:  # a notebook shows the summary table
        return f"<p>Basin job <code>{self.out}</code></p>" + self.summary._repr_html_()

    def __repr__(self) -> str:
        return f"Job(out={str(self.out)!r}, runs={list(self.runs)})"


@dataclass(frozen=True)
class SweepResult:
    """A sweep's folder: its results table, per-round curves and report."""

    out: Path
    name: str
    runs: dict[str, Path] = field(default_factory=dict)  # run id → folder

    @property
    def table(self) -> pd.DataFrame:
        """One row per run: status, error, every run-config key, acc-last-k, … (results.parquet)."""
        import pandas as pd

        return pd.read_parquet(self.out / "results.parquet")

    @property
    def curves(self) -> pd.DataFrame:
        """Every round of every run: ``run`` and the columns of results.csv (curves.parquet)."""
        import pandas as pd

        return pd.read_parquet(self.out / "curves.parquet")

    def report(self) -> list[Path]:
        """Write the paper-style tables and figures into ``out/report`` (experiments.sweep_report)."""
        from experiments.sweep_report import write_report

        return write_report(self.out)

    def _repr_html_(self) -> str:
        columns = [c for c in ("run", "status", "acc-last-k", "rounds-to-target", "error") if c in self.table]
        return f"<p>Basin sweep <code>{self.name}</code> in <code>{self.out}</code></p>" + \
            self.table[columns]._repr_html_()

    def __repr__(self) -> str:
        return f"SweepResult(name={self.name!r}, out={str(self.out)!r}, runs={len(self.runs)})"


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def load_run(path: str | Path) -> Job | SweepResult:
    """A finished (or interrupted) folder back as the object that wrote it: a sweep's folder
    (results.parquet) as a :class:`SweepResult`, a job's or a single run's as a :class:`Job`."""
    from experiments.runtime.finished_runs import method_label

    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise FileNotFoundError(f"run folder {str(path)!r} not found")
    if (folder / "results.parquet").is_file():
        runs = {d.name: d for d in sorted((folder / "runs").iterdir())} if (folder / "runs").is_dir() else {}
        return SweepResult(folder, folder.name, runs)
    if (folder / "config.json").is_file():
        run_dirs = [folder]
    else:
        run_dirs = sorted(d for d in folder.iterdir() if (d / "config.json").is_file())
    if not run_dirs:
        raise FileNotFoundError(f"{folder} holds no Basin run (no config.json in it or its subfolders)")
    configs = {d: read_json(d / "config.json") for d in run_dirs}
    varied = sorted({k for c in configs.values() for k, v in c.items() if any(o.get(k) != v for o in configs.values())}
                    - {"output-dir", "track-dir", "track-group", "strategy", "averaging"})
    labels = {d: method_label(c, varied) if c else d.name for d, c in configs.items()}
    if len(set(labels.values())) < len(labels):  # runs that differ in no shown key: their folders name them
        labels = {d: d.name for d in run_dirs}
    # In the job's order (its summary.csv lists the runs as they ran), else by folder name.
    import pandas as pd

    try:
        order = list(pd.read_csv(folder / "summary.csv")["run"])
    except (OSError, KeyError, ValueError):
        order = []
    run_dirs.sort(key=lambda d: order.index(labels[d]) if labels[d] in order else len(order))
    return Job(folder, {labels[d]: d for d in run_dirs})
