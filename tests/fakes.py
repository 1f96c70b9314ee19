"""What strategy tests share: a grid of fixed nodes, Basin's cohort arguments, and
training requests and replies as a client would send them."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from clients.client_info import ClientInfo
from strategies.cohort import COHORT  # every Basin strategy's fraction and minimum arguments

__all__ = ["COHORT", "NO_CLIENT", "FakeGrid", "bound_strategy", "train_request", "train_reply"]

# The client of a round whose methods read nothing of what a client knows of itself.
NO_CLIENT = ClientInfo(partition_id=0, num_examples=0, label_counts=(0,) * 10, num_classes=10, dataset="", server_round=1)


class FakeGrid:
    """A Flower grid whose nodes are ``node_ids`` (the only call strategies make of it here)."""

    def __init__(self, node_ids: Iterable[int]):
        self.node_ids = list(node_ids)

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)


def train_request(node_id: int) -> Message:
    """A training message to ``node_id`` (what a reply answers)."""
    return Message(content=RecordDict({"config": ConfigRecord()}), dst_node_id=node_id, message_type=MessageType.TRAIN)


def train_reply(node_id: int, weights, n: float = 1, metrics: dict | None = None, **records) -> Message:
    """``node_id``'s reply: its model {"w": weights} (float32), ``num-examples`` = n and other
    ``metrics``, and extra ``records``."""
    content = RecordDict({
        "arrays": ArrayRecord({"w": Array(np.asarray(weights, dtype=np.float32))}),
        "metrics": MetricRecord({"num-examples": n, **(metrics or {})}),
        **records,
    })
    return Message(content=content, reply_to=train_request(node_id))


def bound_strategy(keys: dict, num_clients: int = 3):
    """The strategy the registry builds for run-config ``keys``, its partitions bound to
    nodes 100, 101, … (every client each round)."""
    from experiments.runtime.run_config import resolve_config
    from strategies.methods.strategy_builder import build_strategy

    strategy = build_strategy(resolve_config({"num-clients": num_clients, "participation": 1.0, **keys}))
    strategy.bind_partitions({100 + i: i for i in range(num_clients)}, num_clients, 0)
    return strategy
