"""The shipped sweep crossing data heterogeneity with participation models, ± IMA, on digits:
its runs trained for real (the ServerApp's round loop through the ClientApp's handlers, in
this process, a few rounds each), its report's heat maps of accuracy and IMA's gain, and
their cells recomputed from the runs' own summaries."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from experiments.measurement.in_process_grid import InProcessGrid
from experiments.runtime import sweep_runs
from experiments.runtime.sweep_definition import SWEEP_FILES_DIR, load_sweep
from experiments.sweep_report import write_report
from strategies import server_work
from strategies.config import summary_horizon
from strategies.results import RunRecorder

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py


def in_process_launch(config, out_dir, resources, progress, label, leave, ray_address=None, stop=None):
    """A run of the sweep without Flower's processes: the real ServerApp loop, results and summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    recorder = RunRecorder(out_dir, config, summary_horizon(config), config["target-accuracy"])
    server_work.run(InProcessGrid(config, config["num-clients"]), config, recorder)
    return recorder.complete()


def test_the_participation_sweep_on_digits_draws_heat_maps_of_accuracy_and_imas_gain(tmp_path, monkeypatch):
    sweep = load_sweep(SWEEP_FILES_DIR / "participation-alpha-digits.toml",
                       {"num-rounds": 6, "avg-start": 3, "window": 2, "torch-threads": 1, "server-torch-threads": 1})
    assert len(sweep.runs) == 24  # α (2) × participation model (3) × averaging (2) × seed (2)
    monkeypatch.setattr(sweep_runs, "launch", in_process_launch)
    results = sweep_runs.run_sweep(sweep, tmp_path / "sweep", progress=False)
    assert (results["status"] == "completed").all(), results["error"].tolist()
    paths = write_report(tmp_path / "sweep")
    names = {path.name for path in paths}
    assert {"heatmap.csv", "heatmap-accuracy.png", "heatmap-gain.png"} <= names
    for figure in ("heatmap-accuracy.png", "heatmap-gain.png"):
        assert (tmp_path / "sweep" / "report" / figure).stat().st_size > 10_000

    table = pd.read_csv(tmp_path / "sweep" / "report" / "heatmap.csv")
    assert set(table["method"]) == {"fedavg", "fedavg+ima"} and set(table["row-key"]) == {"alpha"}
    assert list(dict.fromkeys(table["column"])) == [  # as the sweep file's axis says them
        "participation-model=uniform", "participation-model=cyclic, cyclic-groups=4",
        "participation-model=data-correlated, availability-min=0.1"]
    # Every cell from the runs' own summary.json files: the mean over seeds, and the mean paired difference.
    summaries = []
    for run in sweep.runs:
        summary = json.loads((tmp_path / "sweep" / "runs" / run.run_id / "summary.json").read_text())
        summaries.append({"alpha": run.config["alpha"], "model": run.config["participation-model"],
                          "averaging": run.config["averaging"], "seed": run.config["seed"],
                          "acc": summary["acc-last-k"]})
    runs = pd.DataFrame(summaries)
    assert runs.loc[runs["model"] != "uniform"].shape[0] == 16
    for _, cell in table.iterrows():
        model = cell["column"].split(", ")[0].split("=")[1]
        averaging = "ima" if cell["method"] == "fedavg+ima" else "none"
        mine = runs[(runs["alpha"] == cell["row"]) & (runs["model"] == model) & (runs["averaging"] == averaging)]
        assert cell["seeds"] == 2 and cell["acc-last-k"] == pytest.approx(mine["acc"].mean())
        if averaging == "ima":
            base = runs[(runs["alpha"] == cell["row"]) & (runs["model"] == model) & (runs["averaging"] == "none")]
            paired = mine.set_index("seed")["acc"] - base.set_index("seed")["acc"]
            assert cell["gain"] == pytest.approx(paired.mean())
        else:
            assert pd.isna(cell["gain"])
    # cyclic participation changed what the runs learned: not the uniform cells again
    uniform = table[table["column"] == "participation-model=uniform"]["acc-last-k"].to_numpy()
    cyclic = table[table["column"].str.contains("cyclic")]["acc-last-k"].to_numpy()
    assert (uniform != cyclic).any()
