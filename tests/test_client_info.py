"""What a client knows of itself reaches its method (clients/client_info.py): each client's
own label counts, through the ServerApp's round loop and the ClientApp's real handlers, and
the label counts a method declares it wants, in every reply."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from clients import protocol
from clients.client_info import ClientInfo
from clients.components import ClientComponent
from clients.data import partition_indices
from clients.training import CrossEntropy
from experiments.measurement.in_process_grid import InProcessGrid
from experiments.runtime.run_config import resolve_config
from partitions import load_dataset
from partitions.feasibility import partition_settings
from strategies.methods import registry as methods
from strategies.methods.strategy_builder import build_client_schedule
from strategies.server_work import round_train_config, train_rounds
from tests.test_compositions import Rows

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py

# One class per client (Dirichlet α = 0), every client each round.
ONE_CLASS_EACH = {"dataset": "digits", "alpha": 0.0, "num-clients": 10, "participation": 1.0, "num-rounds": 1,
                  "local-epochs": 1, "batch-size": 512, "checkpoint-every": 0, "lr-decay": 1.0}


def test_each_client_sees_its_own_label_counts(tmp_path, monkeypatch):
    """With one class per client, each client's counts have one non-zero entry, its class,
    equal to its partition's size; every part of the round (objective, components) sees it."""
    seen: list[ClientInfo] = []
    components: list[ClientInfo] = []
    monkeypatch.setattr(CrossEntropy, "see_client", lambda self, client: seen.append(client))
    monkeypatch.setattr(ClientComponent, "see_client", lambda self, client: components.append(client))
    config = resolve_config({}, {**ONE_CLASS_EACH, "strategy": "fedprox", "prox-mu": 0.1})
    data = load_dataset("digits", "", True)
    train_rounds(InProcessGrid(config, 10), config, Rows(tmp_path), None, data, torch.device("cpu"))
    indices = partition_indices("digits", "", True, partition_settings(config))
    assert sorted(client.partition_id for client in seen) == list(range(10))
    assert components == seen  # FedProx's proximal term, as its objective
    for client in seen:
        labels = data.y_train.numpy()[indices[client.partition_id]]
        (held,) = np.unique(labels)
        assert client.label_counts == tuple(len(labels) if c == held else 0 for c in range(10))
        assert (client.num_examples, client.num_classes, client.dataset, client.server_round) == (len(labels), 10,
                                                                                                  "digits", 1)
        assert dict(client.run_config) == {"prox-mu": 0.1}  # FedProx's own key, with the run's value


def test_a_method_that_declares_label_counts_gets_them_in_every_reply_and_no_other_does(monkeypatch):
    config = resolve_config({}, ONE_CLASS_EACH)
    schedule = build_client_schedule(config)
    assert protocol.REPORT_LABEL_COUNTS not in round_train_config(config, schedule, 1)
    declared = dataclasses.replace(methods.METHODS_BY_NAME["fedavg"],
                                   reply_records={protocol.LABEL_COUNTS_RECORD: "its label counts"})
    monkeypatch.setitem(methods.METHODS_BY_NAME, "fedavg", declared)
    round_config = round_train_config(config, schedule, 1)
    assert round_config[protocol.REPORT_LABEL_COUNTS] is True
    from flwr.app import ArrayRecord, Message, MessageType, RecordDict

    from clients.client_work import train_reply
    from clients.models import build_run_model

    grid = InProcessGrid(config, 10)
    model = build_run_model(config, (1, 8, 8), 10)
    round_config["server-round"] = 1
    message = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": round_config}),
                      dst_node_id=103, message_type=MessageType.TRAIN)
    message.metadata.__dict__["_message_id"] = "m"
    reply = train_reply(message, grid.contexts[103])
    counts = reply.content[protocol.LABEL_COUNTS_RECORD]["counts"].numpy()
    assert counts.sum() == reply.content["metrics"]["num-examples"] and np.count_nonzero(counts) == 1


def test_a_server_rule_that_declares_label_counts_reads_them_and_the_base_aggregation_never_sees_them(tmp_path,
                                                                                                       monkeypatch):
    """docs/extending.md's server rule: a ServerUpdate declaring the label-counts record reads each
    reply's counts (an ArrayRecord of one ``counts`` array) through ``declared_records``; Basin
    takes them out of the replies before Flower's FedAvg checks them (which expect exactly one
    ArrayRecord a reply: every round failed with InconsistentMessageReplies)."""
    from strategies.cohort import COHORT
    from strategies.sampling import ServerUpdate
    from strategies.weighted_mean import InPlaceFedAvg

    seen: list[list[int]] = []

    class CountsMean(ServerUpdate, InPlaceFedAvg):
        """The mean of the client models weighted by how many labels each counted."""

        def server_update(self, models, metrics, replies):
            counts = [record["counts"].numpy() for record in self.declared_records(protocol.LABEL_COUNTS_RECORD)]
            seen.append([int(c.sum()) for c in counts])
            total = sum(int(c.sum()) for c in counts)
            return {key: sum(m[key] * (int(c.sum()) / total) for m, c in zip(models, counts)).astype(value.dtype)
                    for key, value in models[0].items()}

    declared = dataclasses.replace(methods.METHODS_BY_NAME["fedavg"], build=lambda config: CountsMean(**COHORT),
                                   reply_records={protocol.LABEL_COUNTS_RECORD: "its label counts"})
    monkeypatch.setitem(methods.METHODS_BY_NAME, "fedavg", declared)
    config = resolve_config({}, {**ONE_CLASS_EACH, "num-rounds": 2, "participation": 0.5})
    rows = Rows(tmp_path)
    train_rounds(InProcessGrid(config, 10), config, rows, None, load_dataset("digits", "", True), torch.device("cpu"))
    assert [(row["round-status"], row["clients-ok"]) for row in rows] == [("aggregated", 5), ("aggregated", 5)]
    sizes = [len(i) for i in partition_indices("digits", "", True, partition_settings(config))]
    # one class per client: each reply's counts sum to its partition's size, 5 replies a round
    assert len(seen) == 2 and all(len(counts) == 5 and set(counts) <= set(sizes) for counts in seen)
