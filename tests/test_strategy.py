"""Seeded cohort sampling, partition-ordered aggregation, and the results files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from strategies.fedavg import FedAvg
from strategies.results import RunRecorder, summarize
from strategies.sampling import union_length
from tests.fakes import FakeGrid, train_reply

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py


def _strategy(num_clients=10, cohort=3, seed=0):
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=0, min_available_nodes=0)
    # Node ids are arbitrary; partition p lives on node 1000 + 7p.
    strategy.bind_partitions({1000 + 7 * p: p for p in range(num_clients)}, cohort, seed)
    return strategy


def test_cohort_depends_only_on_seed_and_round():
    a, b = _strategy(seed=4), _strategy(seed=4)
    assert a.sample_partitions(3) == b.sample_partitions(3)
    assert len(set(a.sample_partitions(3))) == 3
    assert any(a.sample_partitions(r) != a.sample_partitions(1) for r in range(2, 6))
    assert any(_strategy(seed=s).sample_partitions(3) != a.sample_partitions(3) for s in (5, 6, 7))


def test_configure_train_addresses_exactly_the_cohort():
    strategy = _strategy()
    grid = FakeGrid([1000 + 7 * p for p in range(10)])
    messages = strategy.configure_train(1, ArrayRecord({"w": Array(np.zeros(2, np.float32))}), ConfigRecord({"lr": 0.1}), grid)
    sent_to = sorted((m.metadata.dst_node_id - 1000) // 7 for m in messages)
    assert sent_to == strategy.sample_partitions(1)


def _reply(node_id, weights, n, **usage):
    return train_reply(node_id, weights, n, {"train-loss": 1.0, **usage})


def test_aggregation_is_weighted_and_independent_of_reply_order():
    strategy = _strategy()
    replies = [_reply(1000, [1.0, 0.1], 1), _reply(1007, [3.0, 0.7], 3), _reply(1014, [0.3, 1e-3], 2)]
    forward, _ = strategy.aggregate_train(1, replies)
    backward, _ = strategy.aggregate_train(1, replies[::-1])
    expected = (np.array([1.0, 0.1]) * 1 + np.array([3.0, 0.7]) * 3 + np.array([0.3, 1e-3]) * 2) / 6
    np.testing.assert_allclose(forward["w"].numpy(), expected, rtol=1e-6)
    assert forward["w"].numpy().tobytes() == backward["w"].numpy().tobytes()
    assert strategy.round_clients["clients-ok"] == 3 and strategy.round_clients["clients-failed"] == 0


def test_union_of_client_work_intervals():
    assert union_length([]) == 0.0
    assert union_length([(0.0, 1.0), (2.0, 3.0)]) == 2.0  # disjoint
    assert union_length([(2.0, 5.0), (0.0, 1.0), (0.5, 3.0), (3.5, 4.0)]) == 5.0  # overlapping, nested, unsorted


def test_round_records_the_cohorts_steps_busy_time_and_peak_gpu_memory():
    strategy = _strategy()
    replies = [
        _reply(1000, [1.0], 1, **{"local-steps": 12, "train-start": 100.0, "train-end": 100.5, "gpu-peak-mb": 300.0}),
        _reply(1007, [1.0], 1, **{"local-steps": 7, "train-start": 100.25, "train-end": 101.0, "gpu-peak-mb": 420.5}),
    ]
    strategy.aggregate_train(1, replies)
    assert strategy.round_clients == {"clients-ok": 2, "clients-failed": 0, "client-steps": 19,
                                      "client-seconds": 1.0, "client-gpu-mb": 420.5}
    strategy.aggregate_train(2, [_reply(1000, [1.0], 1, **{"local-steps": 3})])  # a CPU client
    assert strategy.round_clients["client-seconds"] == 0.0 and np.isnan(strategy.round_clients["client-gpu-mb"])


def test_summary_of_hand_made_rows():
    rows = [{"round": r, "test-accuracy": a} for r, a in enumerate([0.1, 0.5, 0.8, 0.7, 0.9], start=1)]
    summary = summarize(rows, last_k=2, target=0.75)
    assert (summary["acc-last-k"], summary["last-k"]) == ((0.7 + 0.9) / 2, 2)
    assert summary["acc-best"] == 0.9 and summary["best-round"] == 5
    assert summary["rounds-to-target"] == 3
    # A run shorter than k averages all its rounds and says so.
    short = summarize(rows, last_k=10, target=0.75)
    assert (short["last-k"], short["last-k-requested"]) == (5, 10)
    assert short["acc-last-k"] == pytest.approx(sum([0.1, 0.5, 0.8, 0.7, 0.9]) / 5)
    assert "last-k-requested" not in summary


def test_summary_table_shows_real_wall_time_start_up_and_effective_k():
    from experiments.runtime.report import summary_table

    table = summary_table({"FedAvg": {"last-k": 5, "last-k-requested": 10, "last-5-accuracy": 0.5,
                                      "wall-seconds": 23.0, "run-seconds": 40.0, "startup-seconds": 15.0}})
    row = table.loc["FedAvg"]
    assert (row["run-seconds"], row["startup-seconds"], row["last-k"]) == (40.0, 15.0, "5 of 10")


def test_recorder_writes_rows_as_they_come_and_marks_failure(tmp_path):
    recorder = RunRecorder(tmp_path, {"lr": 0.1}, last_k=10, target=0.5)
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "running"
    recorder.append({"round": 1, "test-accuracy": 0.4})
    assert len((tmp_path / "results.csv").read_text().splitlines()) == 2
    recorder.fail(RuntimeError("boom"))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "boom" in summary["error"] and summary["rounds"] == 1


def test_an_older_runs_summary_reads_under_todays_names():
    """Run folders written before the names were unified keep working (docs/outputs.md)."""
    from strategies.results import current_summary

    old = {"last-k": 10, "last-10-accuracy": 0.81, "best-accuracy": 0.9, "final-accuracy": 0.8,
           "round-reaching-target": 7, "rounds": 30}
    assert current_summary(old) == {"last-k": 10, "acc-last-k": 0.81, "acc-best": 0.9, "acc-final": 0.8,
                                    "rounds-to-target": 7, "rounds": 30}
    assert current_summary(current_summary(old)) == current_summary(old)
