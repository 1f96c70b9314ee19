"""Seeded cohort sampling, partition-ordered aggregation, and the results files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from strategies.fedavg import FedAvg
from strategies.results import RunRecorder, summarize
from strategies.round_metrics import union_length
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
        _reply(1000, [1.0], 1, **{"local-steps": 12, "train-start": 100.0, "train-end": 100.5, "gpu-peak-mib": 300.0}),
        _reply(1007, [1.0], 1, **{"local-steps": 7, "train-start": 100.25, "train-end": 101.0, "gpu-peak-mib": 420.5}),
    ]
    strategy.aggregate_train(1, replies)
    assert strategy.round_clients == {"clients-ok": 2, "clients-failed": 0, "client-steps": 19,
                                      "client-seconds": 1.0, "client-gpu-mib": 420.5}
    strategy.aggregate_train(2, [_reply(1000, [1.0], 1, **{"local-steps": 3})])  # a CPU client
    assert strategy.round_clients["client-seconds"] == 0.0 and np.isnan(strategy.round_clients["client-gpu-mib"])


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
    from experiments.runtime.finished_runs import summary_table

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


def test_the_bytes_of_a_message_are_its_arrays():
    """Communication is counted from the arrays a message carries, every ArrayRecord of it."""
    import numpy as np
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

    from strategies.exchange import array_bytes

    model = ArrayRecord({"w": Array(np.zeros((3, 4), dtype=np.float32)), "b": Array(np.zeros(4, dtype=np.float32))})
    control = ArrayRecord({"c": Array(np.zeros(10, dtype=np.float64))})
    content = RecordDict({"arrays": model, "control": control, "config": ConfigRecord({"lr": 0.1})})
    message = Message(content=content, dst_node_id=1, message_type="train")
    expected = sum(len(array.data) for record in (model, control) for array in record.values())
    assert array_bytes(message) == expected and expected > (12 + 4) * 4 + 10 * 8  # np.save's headers included


def test_the_cohorts_accuracy_on_held_out_splits_is_mean_worst_decile_and_spread():
    from strategies.round_metrics import client_accuracy

    stats = client_accuracy([0.9, 0.5, 0.7, 0.8, 0.6, 0.95, 0.85, 0.75, 0.65, 0.55, 0.4])  # 11 clients
    assert stats["client-accuracy-mean"] == pytest.approx(sum([0.9, 0.5, 0.7, 0.8, 0.6, 0.95, 0.85, 0.75, 0.65, 0.55, 0.4]) / 11)
    assert stats["client-accuracy-worst-10pct"] == pytest.approx((0.4 + 0.5) / 2)  # ⌈1.1⌉ = 2 worst clients
    assert client_accuracy([0.3, 0.7])["client-accuracy-worst-10pct"] == 0.3  # at least one client
    assert client_accuracy([0.3, 0.7])["client-accuracy-std"] == pytest.approx(0.2)  # ddof 0
    assert client_accuracy([]) == {}


def test_a_clients_held_out_split_is_seeded_disjoint_and_off_by_default():
    import torch

    from clients.data import client_tensors, held_out_count
    from experiments.runtime.run_config import default_run_config

    assert [held_out_count(n, f) for n, f in [(10, 0.0), (10, 0.2), (10, 0.01), (1, 0.5), (2, 0.5)]] == [0, 2, 1, 0, 1]
    config = default_run_config()
    x, y, x_held, y_held = client_tensors(tuple(sorted(config.items())), 3, 10, "cpu")
    assert len(y_held) == 0
    split = client_tensors(tuple(sorted({**config, "client-evaluation": 0.25}.items())), 3, 10, "cpu")
    assert len(split[1]) + len(split[3]) == len(y) and len(split[3]) == round(0.25 * len(y))
    # Disjoint, and together the whole partition: every sample once.
    rows = {tuple(row.tolist()) for row in torch.cat([split[0], split[2]]).reshape(len(y), -1)}
    assert rows == {tuple(row.tolist()) for row in x.reshape(len(y), -1)}
    again = client_tensors(tuple(sorted({**config, "client-evaluation": 0.25}.items())), 3, 10, "cpu")
    assert torch.equal(again[3], split[3])  # seeded: the same split in every process
    assert not torch.equal(split[2], x[:len(split[3])])  # a seeded draw, not the partition's first samples
