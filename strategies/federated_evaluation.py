"""Federated evaluation (``evaluation = federated``): a server that holds no data.

After each round's aggregation the ServerApp sends the round's models (the base model and,
where the averaging rule has one, the averaged model) in an ``evaluate`` message to the
nodes it sampled for that round, as Flower's evaluate round does. Each node scores them on
its own test split: its data's ``test`` split where it has one, else the seeded hold-out of
``client-evaluation`` of its examples (clients/data.py). The row of ``results.csv`` has the
example-weighted means of the replies, taken in partition order so the sums are the same in
every run; ``client-evaluation.csv`` has one row per node (the reported model's scores).

Compared with central evaluation, a round's scores are over the round's cohort only, so
they vary with the cohort; a node that fails its evaluate message is left out of the means
and named in the log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from clients import protocol
from clients.log import log
from strategies.exchange import send_and_receive
from strategies.round_interface import RoundStrategy
from strategies.round_metrics import client_accuracy

BASE_MODEL, AVERAGED_MODEL = protocol.EVALUATED_BASE_MODEL, protocol.EVALUATED_AVERAGED_MODEL


def evaluate_message_content(server_round: int, base: ArrayRecord, averaged: ArrayRecord | None) -> RecordDict:
    """What an evaluate message carries: the round's base model, its averaged model if any."""
    models = {BASE_MODEL: base, **({AVERAGED_MODEL: averaged} if averaged is not None else {})}
    return RecordDict({**models, "config": ConfigRecord({"server-round": server_round})})


class FederatedEvaluation:
    """Scores each round's models on the sampled nodes' own test splits (module docstring)."""

    kind = "federated"

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.scored_clients: list[dict[str, Any]] = []

    @staticmethod
    def description(config: Mapping[str, Any]) -> dict[str, Any]:
        """summary.json's ``evaluation``."""
        return {
            "kind": "federated",
            "clients": "each round's sampled nodes, after aggregation (an evaluate message)",
            "test-split": (f"each node's own test split where its data has one, else a seeded hold-out of "
                           f"client-evaluation = {config['client-evaluation']:g} of its examples"),
            "aggregate": "the example-weighted mean of the replies (partition order)",
            "server-data": "none: the server reads no data set",
        }

    def __call__(self, grid: Grid, strategy: RoundStrategy, sent: ArrayRecord, server_round: int,
                 model: Any = None) -> dict[str, Any]:
        """The row's scores; ``model`` is the server's (unused: the nodes score)."""
        base, averaged = strategy.round_models(sent)
        content = evaluate_message_content(server_round, base, averaged)
        partition_of_node = strategy.round_cohort()
        messages = [Message(content=content, dst_node_id=node, message_type=MessageType.EVALUATE)
                    for node in sorted(partition_of_node, key=partition_of_node.__getitem__)]
        scored: list[tuple[int, int, Mapping[str, Any]]] = []
        for reply in send_and_receive(grid, messages, self.timeout):
            node = reply.metadata.src_node_id
            if reply.has_error():
                log.warning(f"round {server_round}: partition {partition_of_node.get(node, '?')} (node {node}) did "
                            f"not evaluate: {reply.error.reason}")
                continue
            scored.append((partition_of_node[node], node, reply.content["metrics"]))
        scored.sort(key=lambda entry: entry[0])
        missing = len(messages) - len(scored)
        if missing:
            log.warning(f"round {server_round}: {missing} of {len(messages)} sampled nodes gave no evaluation")
        reported = AVERAGED_MODEL if averaged is not None else BASE_MODEL
        self.scored_clients = [
            {"partition": partition, "node": node, "examples": int(metrics[protocol.EVALUATED_EXAMPLES]),
             "accuracy": float(metrics[f"{reported}-accuracy"]), "loss": float(metrics[f"{reported}-loss"])}
            for partition, node, metrics in scored
        ]
        row: dict[str, Any] = {"sent-model": "base", "clients-evaluated": len(scored)}
        for model in (BASE_MODEL, AVERAGED_MODEL) if averaged is not None else (BASE_MODEL,):
            row[f"{model}-accuracy"], row[f"{model}-loss"] = weighted_scores(scored, model)
        row["test-accuracy"], row["test-loss"] = row[f"{reported}-accuracy"], row[f"{reported}-loss"]
        if averaged is not None and strategy.sends_average:
            row["sent-model"] = "averaged"
        return {**row, **client_accuracy([client["accuracy"] for client in self.scored_clients])}

    def client_rows(self, strategy: RoundStrategy) -> list[dict[str, Any]]:
        """The last round's nodes' scores of its reported model (partition order)."""
        return self.scored_clients


def weighted_scores(scored: list[tuple[int, int, Mapping[str, Any]]], model: str) -> tuple[float, float]:
    """(accuracy, loss) of ``model`` over the replies, each weighted by its examples; NaN
    without a reply."""
    examples = sum(int(metrics[protocol.EVALUATED_EXAMPLES]) for _, _, metrics in scored)
    if not examples:
        return float("nan"), float("nan")
    loss = accuracy = 0.0
    for _, _, metrics in scored:
        weight = int(metrics[protocol.EVALUATED_EXAMPLES]) / examples
        loss += weight * float(metrics[f"{model}-loss"])
        accuracy += weight * float(metrics[f"{model}-accuracy"])
    return accuracy, loss
