"""The number every report rests on: the mean test accuracy over the last ``summary-last-k``
rounds, for each k the shipped setups use, the same in a run's summary, a sweep's table
and the job's summary table."""

from __future__ import annotations

import math

import pytest

from experiments.runtime.finished_runs import summary_table
from experiments.runtime.run_config import PRESETS_DIR, load_preset, resolve_config
from experiments.runtime.sweep_definition import SWEEP_FILES_DIR, load_sweep
from experiments.runtime.sweep_runs import _summary_columns
from strategies.config import summary_horizon
from strategies.results import RunRecorder

ROUNDS = 150


def _accuracies() -> list[float]:
    """Distinct per round, so a window one round too long or short gives another mean."""
    return [0.2 + 0.6 * math.sin(0.37 * round_) ** 2 for round_ in range(1, ROUNDS + 1)]


def test_the_shipped_setups_report_the_last_5_10_or_100_rounds():
    presets = {resolve_config(load_preset(str(path)))["summary-last-k"] for path in PRESETS_DIR.glob("*.toml")}
    sweeps = {run.config["summary-last-k"] for path in SWEEP_FILES_DIR.glob("*.toml") for run in load_sweep(path).runs}
    assert presets | sweeps == {5, 10, 100}


@pytest.mark.parametrize("k", [5, 10, 100])
def test_the_reported_accuracy_is_the_mean_of_the_last_k_rounds_everywhere(tmp_path, k):
    config = resolve_config({"summary-last-k": k, "num-rounds": ROUNDS})
    recorder = RunRecorder(tmp_path, config, summary_horizon(config), config["target-accuracy"])
    accuracies = _accuracies()
    for round_, accuracy in enumerate(accuracies, start=1):
        recorder.append({"round": round_, "test-accuracy": accuracy})
    summary = recorder.complete()

    expected = sum(accuracies[-k:]) / k
    for other in (k - 1, k + 1):
        assert abs(sum(accuracies[-other:]) / other - expected) > 1e-6  # the test tells k from k ± 1
    assert summary["last-k"] == k and summary["acc-last-k"] == pytest.approx(expected, abs=1e-12)
    in_sweep_table = _summary_columns(tmp_path)
    assert in_sweep_table["last-k"] == k and in_sweep_table["acc-last-k"] == pytest.approx(expected, abs=1e-12)
    in_job_table = summary_table({"run": summary}).loc["run"]
    assert in_job_table["last-k"] == k and in_job_table["acc-last-k"] == pytest.approx(expected, abs=1e-12)
