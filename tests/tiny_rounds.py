"""A server method's rounds on tiny arrays through Flower Messages, for the methods' tests:
four clients (NODES: node id → partition), two a round."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from tests.fakes import FakeGrid

NODES = {1000 + 7 * p: p for p in range(4)}


def f32(values) -> np.ndarray:
    return np.asarray(values, np.float32)


def configure(strategy, server_round, theta, lr=0.1):
    sent = ArrayRecord({"w": Array(f32(theta)), "n": Array(np.array([3], np.int64))})
    return list(strategy.configure_train(server_round, sent, ConfigRecord({"lr": lr}), FakeGrid(NODES)))


def replies(strategy, messages, model_of, steps_of=lambda p: 5):
    out = []
    for message in messages:
        p = strategy.partition_of_node[message.metadata.dst_node_id]
        content = RecordDict({
            "arrays": ArrayRecord({"w": Array(f32(model_of(p))), "n": Array(np.array([4 + 2 * p], np.int64))}),
            "metrics": MetricRecord({"num-examples": 10 * (p + 1), "train-loss": 1.0, "local-steps": steps_of(p)}),
        })
        out.append(Message(content=content, reply_to=message))
    return out[::-1]  # arrival order must not matter


def bound(strategy):
    strategy.bind_partitions(NODES, 2, seed=0)  # 2 of 4 clients per round
    return strategy
