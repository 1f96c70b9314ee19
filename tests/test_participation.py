"""Participation models (strategies/participation.py) and the simulated clock
(strategies/system_clock.py): the draws by hand, the cohorts they give, today's bits kept
under ``uniform`` + ``wait``, a resume, and the columns a run writes."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from clients.options import ConfigError
from experiments.measurement.in_process_grid import InProcessGrid
from experiments.runtime.run_config import resolve_config
from partitions import load_dataset
from strategies import server_work
from strategies.checkpoint import CHECKPOINT_FILE, read_checkpoint
from strategies.methods.strategy_builder import build_strategy
from strategies.participation import Cyclic, build_participation, counter_uniforms
from strategies.results import summarize
from strategies.system_clock import SystemClock, local_epochs_of, read_trace
from tests.test_compositions import Rows
from tests.test_reproduce import FAKE_TABLE, fake_results

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py

SMALL = {"dataset": "digits", "num-clients": 12, "participation": 0.25, "num-rounds": 4, "local-epochs": 1,
         "batch-size": 32, "momentum": 0.0, "min-partition-size": 1, "checkpoint-every": 0, "torch-threads": 1,
         "server-torch-threads": 1, "device": "cpu", "save-models-every": 0}


def test_counter_draws_depend_on_seed_round_and_client_only():
    everyone = counter_uniforms(7, 1, 3, np.arange(1000))
    assert np.array_equal(counter_uniforms(7, 1, 3, np.array([5, 999, 0])), everyone[[5, 999, 0]])
    assert not np.array_equal(counter_uniforms(7, 1, 4, np.arange(1000)), everyone)  # another round
    assert not np.array_equal(counter_uniforms(8, 1, 3, np.arange(1000)), everyone)  # another seed
    assert not np.array_equal(counter_uniforms(7, 2, 3, np.arange(1000)), everyone)  # another stream
    assert (everyone >= 0).all() and (everyone < 1).all() and abs(everyone.mean() - 0.5) < 0.03


def test_uniform_samples_as_basin_always_did():
    """uniform draws nothing: the cohort is NumPy's choice seeded by (seed, round), as before the models."""
    config = resolve_config({}, SMALL)
    strategy = build_strategy(config)
    strategy.bind_partitions({100 + p: p for p in range(12)}, 3, config["seed"])
    for server_round in (1, 2, 9):
        chosen = np.random.default_rng([config["seed"], server_round]).choice(12, size=3, replace=False)
        assert strategy.sample_partitions(server_round) == sorted(int(p) for p in chosen)


def test_cyclic_groups_take_turns_by_hand():
    """6 clients, 3 groups (k mod 3), 2 rounds each: rounds 1–2 {0, 3}, 3–4 {1, 4}, 5–6 {2, 5}, 7 {0, 3}."""
    cyclic = Cyclic(groups=3, rounds_per_group=2)
    assert [list(np.flatnonzero(cyclic.available(t, 6))) for t in (1, 2, 3, 4, 5, 6, 7)] == [
        [0, 3], [0, 3], [1, 4], [1, 4], [2, 5], [2, 5], [0, 3]]


def test_availability_probabilities_by_hand():
    config = resolve_config({}, {**SMALL, "num-clients": 3, "participation": 1.0, "participation-model": "availability",
                                 "availability-source": "data-size", "availability-min": 0.2, "availability-max": 1.0})
    # sizes 10, 30, 50: p = 0.2 + 0.8·(n − 10)/40
    assert np.allclose(build_participation(config, np.array([10, 30, 50])).probabilities, [0.2, 0.6, 1.0])
    correlated = resolve_config({}, {**config, "participation-model": "data-correlated", "correlated-classes": 1})
    counts = np.array([[4, 0], [1, 3], [0, 5]])  # shares of class 0: 1, 1/4, 0
    assert np.allclose(build_participation(correlated, None, counts).probabilities, [1.0, 0.4, 0.2])
    # the first half of the classes by default: of 4 classes, 0 and 1
    halves = resolve_config({}, {**correlated, "correlated-classes": 0})
    assert np.allclose(build_participation(halves, None, np.array([[1, 1, 2, 0], [0, 0, 0, 3], [3, 1, 0, 0]]))
                       .probabilities, [0.6, 0.2, 1.0])


def test_availability_draws_follow_each_clients_probability():
    config = {"participation-model": "availability", "availability-source": "random", "availability-min": 0.1,
              "availability-max": 1.0, "num-clients": 20000, "seed": 0}  # more clients than digits can partition
    model = build_participation(config)
    rounds = np.stack([model.available(t, 20000) for t in range(1, 41)])
    p = model.probabilities
    assert 0.1 <= p.min() < 0.11 and 0.99 < p.max() <= 1.0
    low, high = p < 0.3, p > 0.8
    assert abs(rounds[:, low].mean() - p[low].mean()) < 0.01 and abs(rounds[:, high].mean() - p[high].mean()) < 0.01


def test_the_cohort_comes_from_the_available_clients_and_too_few_skip_the_round():
    config = resolve_config({}, {**SMALL, "participation-model": "cyclic", "cyclic-groups": 4, "min-replies": 3})
    strategy = build_strategy(config)
    strategy.bind_partitions({100 + p: p for p in range(12)}, 3, config["seed"], min_replies=3,
                             participation=build_participation(config))
    for server_round in range(1, 9):
        group = (server_round - 1) % 4
        assert strategy.sample_partitions(server_round) == [group, group + 4, group + 8]
    strategy.bind_partitions({100 + p: p for p in range(12)}, 3, config["seed"], min_replies=3,
                             participation=Cyclic(groups=6, rounds_per_group=1))  # 2 available, 3 needed
    assert strategy.sample_partitions(1) == [] and strategy.round_available == 2


def test_keys_are_checked_together_in_one_line():
    cases = [
        ({"availability-min": 0.9, "availability-max": 0.5}, "exceeds availability-max"),
        ({"straggler-policy": "deadline", "round-deadline": 5.0}, "system-speeds = 'none'"),
        ({"system-speeds": "lognormal", "straggler-policy": "partial"}, "round-deadline = 0"),
        ({"system-speeds": "lognormal", "round-deadline": 5.0}, "does nothing under straggler-policy = 'wait'"),
        ({"system-speeds": "trace"}, "exactly when system-speeds = 'trace'"),
        ({"participation-model": "cyclic", "cyclic-groups": 13}, "exceeds num-clients"),
        ({"local-epochs-range": "5-2"}, "'local-epochs-range' = '5-2' is not allowed"),
        ({"participation-model": "data-correlated", "evaluation": "federated", "client-evaluation": 0.2},
         "holds no data"),
        ({"participation-model": "cyclic", "dp-clipping-norm": 1.0}, "amplification does not cover"),
    ]
    for keys, phrase in cases:
        with pytest.raises(ConfigError) as error:
            resolve_config({}, {**SMALL, **keys})
        assert phrase in str(error.value) and "\n" not in str(error.value), (keys, str(error.value))


def test_a_trace_file_gives_each_client_a_row_and_a_bad_one_is_named(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("speed,bandwidth-mbps\n2.0,8\n0.5,80\n")
    speeds, bandwidths = read_trace(str(trace))
    assert list(speeds) == [2.0, 0.5] and list(bandwidths) == [1e6, 1e7]  # megabits → bytes per second
    config = resolve_config({}, {**SMALL, "system-speeds": "trace", "speed-trace": str(trace)})
    clock = SystemClock(config)
    assert [clock.client_entries(k)["client-speed"] for k in range(4)] == [2.0, 0.5, 2.0, 0.5]
    trace.write_text("speed,bandwidth-mbps\n2.0,x\n")
    with pytest.raises(ConfigError, match="line 2"):
        resolve_config({}, {**SMALL, "system-speeds": "trace", "speed-trace": str(trace)})


def test_shipped_trace_is_valid():
    speeds, bandwidths = read_trace(str(Path(__file__).parents[1] / "examples" / "system-heterogeneity" / "device-trace.csv"))
    assert len(speeds) >= 20 and speeds.max() / speeds.min() > 10


def test_local_epochs_range_draws_each_client_its_epochs():
    config = resolve_config({}, {**SMALL, "local-epochs-range": "2-5"})
    drawn = [e for t in range(1, 201) for e in local_epochs_of(config, t, list(range(12))).values()]
    assert set(drawn) == {2, 3, 4, 5} and abs(np.mean(drawn) - 3.5) < 0.1
    assert local_epochs_of(config, 3, [4, 7]) == {p: e for p, e in local_epochs_of(config, 3, list(range(12))).items()
                                                  if p in (4, 7)}


def _run(directory: Path, **keys: Any) -> tuple[Rows, dict[str, torch.Tensor]]:
    config = resolve_config({}, {**SMALL, "output-dir": str(directory), **keys})
    directory.mkdir(exist_ok=True)
    rows = Rows(directory)
    server_work.train_rounds(InProcessGrid(config, config["num-clients"]), config, rows, None,
                             load_dataset("digits", "", True), torch.device("cpu"))
    return rows, torch.load(directory / "final_model.pt")


def _same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_uniform_and_wait_keep_todays_bits_and_the_clock_only_adds_columns(tmp_path):
    """Everyone available with probability 1, or a clock whose policy waits, trains exactly
    today's rounds; the clock's columns add up."""
    rows, today = _run(tmp_path / "today")
    _, everyone = _run(tmp_path / "everyone", **{"participation-model": "availability", "availability-min": 1.0})
    clock_rows, waited = _run(tmp_path / "clock", **{"system-speeds": "lognormal"})
    assert _same_bits(today, everyone) and _same_bits(today, waited)
    assert [r["test-accuracy"] for r in rows] == [r["test-accuracy"] for r in clock_rows]
    seconds = [r["simulated-seconds"] for r in clock_rows]
    assert all(s > 0 for s in seconds) and clock_rows[-1]["simulated-time"] == pytest.approx(sum(seconds))
    assert all(r["clients-late"] == r["clients-partial"] == 0 for r in clock_rows)


def test_a_resumed_run_draws_the_same_cohorts_and_clock(tmp_path, monkeypatch):
    """Cyclic participation with partial work, killed after round 2 and resumed: the same rows
    (cohorts, available counts, simulated time) and the same final model, bit for bit."""
    keys = {"participation-model": "availability", "availability-min": 0.3, "system-speeds": "lognormal",
            "speed-sigma": 1.0, "straggler-policy": "partial", "round-deadline": 0.3, "checkpoint-every": 2,
            "local-epochs-range": "1-3"}
    whole_rows, whole = _run(tmp_path / "whole", **keys)
    assert any(r["clients-partial"] for r in whole_rows)  # the deadline cuts some clients short
    written = server_work.write_checkpoint

    def keep_round_two(directory, config, server_round, *args):
        written(directory, config, server_round, *args)
        if server_round == 2:
            shutil.copy(Path(directory) / CHECKPOINT_FILE, tmp_path / "round-2.pt")

    monkeypatch.setattr(server_work, "write_checkpoint", keep_round_two)
    _run(tmp_path / "killed", **keys)
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    shutil.copy(tmp_path / "round-2.pt", resumed_dir / CHECKPOINT_FILE)
    config = resolve_config({}, {**SMALL, "output-dir": str(resumed_dir), **keys})
    checkpoint = read_checkpoint(resumed_dir, config)
    rows = Rows(resumed_dir)
    rows.extend(checkpoint["rows"])
    server_work.train_rounds(InProcessGrid(config, 12), config, rows, checkpoint, load_dataset("digits", "", True),
                             torch.device("cpu"))
    assert _same_bits(whole, torch.load(resumed_dir / "final_model.pt"))
    columns = ("round", "test-accuracy", "clients-ok", "clients-available", "simulated-seconds", "simulated-time",
               "clients-partial", "client-steps")
    assert [[r[c] for c in columns] for r in rows] == [[r[c] for c in columns] for r in whole_rows]


def test_the_summary_gives_time_to_target_beside_rounds_to_target():
    rows = [{"round": t, "test-accuracy": a, "simulated-time": s}
            for t, a, s in ((1, 0.2, 3.0), (2, 0.6, 7.5), (3, 0.7, 9.0))]
    summary = summarize(rows, 2, 0.5)
    assert (summary["rounds-to-target"], summary["time-to-target"], summary["simulated-time"]) == (2, 7.5, 9.0)
    assert summarize(rows, 2, 0.9)["time-to-target"] is None


def test_a_runs_and_a_sweeps_tables_carry_the_clocks_columns(tmp_path):
    """experiments.api's job.summary (finished_runs.summary_table) and a sweep's results table
    (sweep_runs) have time-to-target and simulated-time beside rounds-to-target."""
    import json

    from experiments.runtime.finished_runs import summary_table
    from experiments.runtime.sweep_runs import _summary_columns

    summary = {"status": "completed", "rounds": 3, "acc-last-k": 0.5, "rounds-to-target": 2, "time-to-target": 7.5,
               "simulated-time": 9.0}
    row = summary_table({"run": summary}).loc["run"]
    assert (row["rounds-to-target"], row["time-to-target"], row["simulated-time"]) == (2, 7.5, 9.0)
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    columns = _summary_columns(tmp_path)
    assert (columns["time-to-target"], columns["simulated-time"]) == (7.5, 9.0)


def test_rounds_cells_of_runs_on_the_simulated_clock_give_time_to_target_beside_rounds(tmp_path):
    """With system-speeds, each run's summary has time-to-target: a rounds cell reports the
    seeds' mean beside its rounds, and the report says it; without the clock nothing is added."""
    from experiments.reproduction.report_files import basin_text
    from experiments.reproduction.table_cells import load_table
    from experiments.reproduction.verdicts import compare

    (tmp_path / "fake-table.toml").write_text(FAKE_TABLE)
    fake_table = load_table(str(tmp_path / "fake-table.toml"))
    results, runs_of = fake_results(fake_table, {}, {"FedProx | Rounds": [3, 4]})
    plain = compare(fake_table, results, runs_of).set_index(["row", "column", "variant"]).loc[("FedProx", "Rounds", "")]
    assert pd.isna(plain["basin time-to-target"]) and basin_text(plain.to_dict()) == "4"
    seconds = {run: s for run, s in zip(runs_of["FedProx | Rounds"], (120.0, 180.0))}
    results["time-to-target"] = results["run"].map(seconds)
    cell = compare(fake_table, results, runs_of).set_index(["row", "column", "variant"]).loc[("FedProx", "Rounds", "")]
    assert cell["basin"] == 3.5 and cell["basin time-to-target"] == 150.0
    assert basin_text(cell.to_dict()) == "4 (150 s simulated)"
