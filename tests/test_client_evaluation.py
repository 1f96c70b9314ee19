"""Per-client accuracy (``client-evaluation``): each accepted client's score of the model it
received, on its held-out split, one row per client and round in client-evaluation.csv,
read back by the Python API; the cohort summaries of results.csv are its mean and worst
decile; a resumed run keeps the rows of the rounds its checkpoint holds."""

from __future__ import annotations

import csv

import numpy as np
import pandas as pd
import pytest
import torch

from clients.data import held_out_count, partition_indices
from experiments.job_results import Job
from experiments.measurement.in_process_grid import InProcessGrid
from experiments.runtime.run_config import resolve_config
from partitions import load_dataset
from partitions.feasibility import partition_settings
from strategies.config import summary_horizon
from strategies.results import CLIENT_EVALUATION_FILE, RunRecorder
from strategies.server_work import train_rounds

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py


def test_each_clients_accuracy_on_its_held_out_split_is_a_row_of_its_own(tmp_path):
    config = resolve_config({}, {"num-clients": 6, "participation": 0.5, "num-rounds": 2, "local-epochs": 1,
                                 "client-evaluation": 0.25, "checkpoint-every": 0})
    recorder = RunRecorder(tmp_path / "run", config, summary_horizon(config), config["target-accuracy"])
    train_rounds(InProcessGrid(config, 6), config, recorder, None, load_dataset("digits", "", True),
                 torch.device("cpu"))
    clients = Job(tmp_path, {"FedAvg": tmp_path / "run"}).client_evaluation
    assert list(clients.columns) == ["run", "round", "partition", "node", "examples", "accuracy", "loss"]
    assert clients.groupby("round").size().tolist() == [3, 3]  # the cohort, each round
    sizes = [len(indices) for indices in partition_indices("digits", "", True, partition_settings(config))]
    assert all(row.examples == held_out_count(sizes[row.partition], 0.25) for row in clients.itertuples())
    assert all(row.node == 100 + row.partition for row in clients.itertuples())
    assert clients["accuracy"].between(0, 1).all() and np.isfinite(clients["loss"]).all()
    rounds = pd.read_csv(tmp_path / "run" / "results.csv").set_index("round")
    for server_round, cohort in clients.groupby("round"):
        assert rounds.loc[server_round, "client-accuracy-mean"] == pytest.approx(cohort["accuracy"].mean())
        assert rounds.loc[server_round, "client-accuracy-worst-10pct"] == pytest.approx(cohort["accuracy"].min())


def test_a_resumed_run_keeps_the_rows_of_the_rounds_its_checkpoint_holds(tmp_path):
    config = resolve_config({}, {"client-evaluation": 0.25})
    (tmp_path / CLIENT_EVALUATION_FILE).write_text("round,partition,node,examples,accuracy,loss\n"
                                                   "1,0,100,5,0.4,1.2\n2,0,100,5,0.6,1.0\n3,0,100,5,0.7,0.9\n")
    RunRecorder(tmp_path, config, 10, 0.5, rows=[{"round": 1}, {"round": 2}], resumed_after=2)
    with open(tmp_path / CLIENT_EVALUATION_FILE, newline="") as f:
        assert [row[0] for row in csv.reader(f)] == ["round", "1", "2"]
    RunRecorder(tmp_path, config, 10, 0.5)  # a fresh run starts the file afresh
    assert (tmp_path / CLIENT_EVALUATION_FILE).read_text() == "round,partition,node,examples,accuracy,loss\n"


def _reply_of_a_client_with(x, y, x_held_out, y_held_out, monkeypatch):
    """The ClientApp's reply to a training message of round 1 from a model that predicts class 0
    for every input (its classifier's bias), with this client's tensors; the method (FedAvg)
    declares the label counts so the reply carries them."""
    import dataclasses

    from flwr.app import ArrayRecord, Message, MessageType, RecordDict

    from clients import protocol
    from clients.client_work import training_reply
    from clients.models import build_run_model
    from strategies.methods import registry
    from strategies.methods.strategy_builder import build_client_schedule
    from strategies.server_work import round_train_config

    config = resolve_config({}, {"num-clients": 6, "client-evaluation": 0.25, "checkpoint-every": 0})
    declared = dataclasses.replace(registry.METHODS_BY_NAME["fedavg"],
                                   reply_records={protocol.LABEL_COUNTS_RECORD: "its label counts"})
    monkeypatch.setitem(registry.METHODS_BY_NAME, "fedavg", declared)
    round_config = round_train_config(config, build_client_schedule(config), 1)
    round_config["server-round"] = 1
    grid = InProcessGrid(config, 6)
    model = build_run_model(config, (1, 8, 8), 10)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.zero_()
            if name.endswith("bias"):
                parameter[0] = 10.0  # class 0 wins everywhere
    message = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": round_config}),
                      dst_node_id=100, message_type=MessageType.TRAIN)
    message.metadata.__dict__["_message_id"] = "m"
    reply = training_reply(message, grid.contexts[100], 0.0, torch.device("cpu"), model,
                           (x, y, x_held_out, y_held_out), 10)
    return reply.content["metrics"], reply.content[protocol.LABEL_COUNTS_RECORD]["counts"].numpy()


def test_the_held_out_score_is_of_the_held_out_examples_and_the_counts_of_the_training_split(monkeypatch):
    """A client that trains on 6 examples of class 0 and holds out 2 of class 3 that the model
    (always class 0) never predicts: its held-out accuracy is 0 on 2 examples (scored on its
    training split it would be 1), and its label counts are its training split's, 6 of class 0
    and none of class 3 (over the whole partition they would count the held-out two)."""
    from clients import protocol

    x, x_held_out = torch.randn(6, 1, 8, 8), torch.randn(2, 1, 8, 8)
    y, y_held_out = torch.zeros(6, dtype=torch.int64), torch.full((2,), 3, dtype=torch.int64)
    metrics, counts = _reply_of_a_client_with(x, y, x_held_out, y_held_out, monkeypatch)
    assert (metrics[protocol.HELD_OUT_ACCURACY], metrics[protocol.HELD_OUT_EXAMPLES]) == (0.0, 2)
    assert counts.tolist() == [6, 0, 0, 0, 0, 0, 0, 0, 0, 0] and metrics["num-examples"] == 6


def test_a_label_beyond_the_classes_is_an_error_not_a_count_dropped():
    from clients.client_info import ClientInfo

    with pytest.raises(ValueError, match="partition 4 holds label 10, out of range for num_classes = 10"):
        ClientInfo.of(torch.tensor([0, 10, -100]), 10, partition_id=4)
    assert ClientInfo.of(torch.tensor([0, 9, -100]), 10).label_counts == (1,) + (0,) * 8 + (1,)


def test_apportion_is_proportional_with_the_largest_remainders():
    from partitions.test_slices import apportion

    # 7 · (6, 3, 1, 0) / 10 = (4.2, 2.1, 0.7, 0): floors (4, 2, 0, 0), the one left to the 0.7
    assert apportion(7, np.array([6, 3, 1, 0])).tolist() == [4, 2, 1, 0]
    assert apportion(3, np.array([1, 1, 1, 1])).tolist() == [1, 1, 1, 0]  # ties: the lower class
    assert apportion(5, np.array([0, 0])).tolist() == [0, 0]


@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
def test_a_test_slice_takes_nothing_from_training_and_follows_the_clients_label_proportions(partition):
    """client-evaluation-split = test-slice: each client trains on its whole partition (the
    tensors of client-evaluation = 0) and is scored on test examples whose class counts are
    its own apportioned to round(f · n_k); slices are disjoint where the test split has enough
    of a class (IID), and a class's examples are reused, in one order, only once it runs out."""
    from clients.data import client_tensors, partition_test_slices
    from partitions.test_slices import apportion

    # digits: 1438 training and 359 test examples; f = 0.2 asks for about 288 of them
    keys = {"num-clients": 6, "client-evaluation": 0.2 if partition == "dirichlet" else 0.15,
            "client-evaluation-split": "test-slice", "partition": partition}
    config = resolve_config({}, keys)
    plain = resolve_config({}, {**keys, "client-evaluation": 0.0})
    data = load_dataset("digits", "", True)
    members = partition_indices("digits", "", True, partition_settings(config))
    slices = partition_test_slices("digits", "", True, partition_settings(config), config["client-evaluation"],
                                   config["seed"])
    for k in range(6):
        x, y, x_test, y_test = client_tensors(tuple(sorted(config.items())), k, 6, "cpu")
        x_all, y_all, _, _ = client_tensors(tuple(sorted(plain.items())), k, 6, "cpu")
        assert torch.equal(x, x_all) and torch.equal(y, y_all) and len(y) == len(members[k])
        counts = np.bincount(y.numpy(), minlength=10)
        wanted = apportion(held_out_count(len(y), config["client-evaluation"]), counts)
        assert np.bincount(y_test.numpy(), minlength=10).tolist() == wanted.tolist()
        assert torch.equal(x_test, data.x_test[torch.from_numpy(slices[k])])
    every = np.concatenate(slices)
    exhausted = 0
    for c in range(10):
        drawn = every[data.y_test.numpy()[every] == c]
        pool = int((data.y_test == c).sum())
        if len(drawn) <= pool:
            assert len(set(drawn.tolist())) == len(drawn)  # disjoint while the class lasts
        else:
            assert len(set(drawn.tolist())) == pool  # every one used, then reused
            exhausted += 1
    assert (exhausted == 0) if partition == "iid" else (exhausted > 0)


def test_the_summary_has_the_last_rounds_spread_over_clients():
    from strategies.results import client_accuracy_summary

    accuracies = [0.9, 0.1, 0.5, 0.7, 0.3]
    summary = client_accuracy_summary(4, accuracies)
    assert summary["round"] == 4 and summary["clients"] == 5 and summary["worst-10pct"] == 0.1
    assert [summary[k] for k in ("p10", "p50", "p90")] == pytest.approx(np.percentile(accuracies, [10, 50, 90]).tolist())
    assert (summary["mean"], summary["std"]) == pytest.approx((np.mean(accuracies), np.std(accuracies)))
