"""What a method exchanges with each client in a round: bytes down (server → client) and up
(client → server), the arrays of every message of the round (the model, SCAFFOLD's controls,
FedFA's anchors, MIME's extra exchange), counted as results.csv's ``bytes-sent`` and
``bytes-received`` count them (strategies/exchange.array_bytes).

Measured on the real path, not derived from a formula: the method's own strategy runs rounds
through an in-process grid (experiments/measurement/in_process_grid.py) to the ClientApp's own
training and gradient replies (clients/client_work.py), for one client that trains on a few
synthetic examples. The bytes depend on the model's shapes and on the method, not on the
examples, so any model and input shape can be measured without its data set.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, Message, MessageType

from clients import protocol
from clients.client_work import gradient_reply, training_reply
from clients.flower_internals import task_identity
from clients.models import build_model, uses_projection_head
from experiments.measurement.in_process_grid import InProcessGrid
from strategies.exchange import send_and_receive
from strategies.methods.registry import hand_over_client_halves
from strategies.methods.strategy_builder import build_client_schedule, build_strategy
from strategies.server_work import round_train_config

ROUNDS = 2  # the last one is reported: from round 2 on, every method sends all it ever sends
EXAMPLES = 4  # the client's synthetic examples (BatchNorm needs more than one)
NODE_ID = 100  # the in-process grid's node of partition 0


@contextlib.contextmanager
def server_side() -> Iterator[None]:
    """Messages are stamped with the sender's ids, as inside a ServerApp; restored after.
    Flower's INFO/WARNING lines (strategy settings, sampled nodes) are silenced meanwhile."""
    flower_logger = logging.getLogger("flwr")
    level = flower_logger.level
    flower_logger.setLevel(logging.ERROR)
    try:
        with task_identity(run_id=1, node_id=0, task_id=1):
            yield
    finally:
        flower_logger.setLevel(level)


@dataclass(frozen=True)
class RoundTraffic:
    """Bytes one client receives (``down``) and sends (``up``) in a round, and the bytes of
    the model's own arrays (what FedAvg sends each way)."""

    down: int
    up: int
    model: int


def synthetic_client(model_name: str, input_shape: tuple[int, ...], num_classes: int, projection_head: bool,
                     seed: int) -> dict[str, Any]:
    """The grid's handlers: the ClientApp's training and gradient replies on CPU, with the
    received weights in a fresh model and ``EXAMPLES`` synthetic examples as the client's data."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(EXAMPLES, *input_shape, generator=generator)
    y = torch.arange(EXAMPLES) % num_classes
    cpu = torch.device("cpu")

    def received_model(msg: Message) -> torch.nn.Module:
        model = build_model(model_name, input_shape, num_classes, projection_head)
        model.load_state_dict(msg.content[protocol.MODEL_RECORD].to_torch_state_dict())
        return model

    def train(msg: Message, context: Context) -> Message:
        return training_reply(msg, context, time.time(), cpu, received_model(msg), (x, y, x[:0], y[:0]), num_classes)

    def full_gradient(msg: Message, context: Context) -> Message:
        return gradient_reply(msg, received_model(msg), x, y)

    return {MessageType.TRAIN: train, f"{MessageType.QUERY}.{protocol.FULL_GRADIENT_ACTION}": full_gradient}


def measure_traffic(config: Mapping[str, Any], model_name: str, input_shape: tuple[int, ...],
                    num_classes: int) -> RoundTraffic:
    """One client's traffic in round ``ROUNDS`` of ``config``'s method (its validated run
    config), with every round's exchanges: MIME's gradient query, the training message, the reply."""
    hand_over_client_halves()
    config = {**dict(config), "device": "cpu", "local-epochs": 1, "batch-size": EXAMPLES}
    torch.manual_seed(config["seed"])
    projection_head = uses_projection_head(model_name, config["strategy"])
    arrays = ArrayRecord(build_model(model_name, input_shape, num_classes, projection_head).state_dict())
    grid = InProcessGrid(config, 1, synthetic_client(model_name, input_shape, num_classes, projection_head,
                                                     config["seed"]))
    schedule = build_client_schedule(config)
    with server_side():
        strategy = build_strategy(config)
        strategy.bind_partitions({NODE_ID: 0}, 1, config["seed"])
        for server_round in range(1, ROUNDS + 1):
            sent, received = grid.bytes_sent, grid.bytes_received
            strategy.prepare_round(server_round, arrays, grid)
            train_config = round_train_config(config, schedule, server_round)
            replies = send_and_receive(grid, strategy.configure_train(server_round, arrays, train_config, grid),
                                       float(config["round-timeout"]))
            failed = [reply.error.reason for reply in replies if reply.has_error()]
            if failed:
                raise RuntimeError(f"strategy {config['strategy']!r}: the measured client failed: {failed[0]}")
            aggregated, _ = strategy.aggregate_train(server_round, replies)
            arrays = aggregated if aggregated is not None else arrays
    model_bytes = sum(len(array.data) for array in arrays.values())
    return RoundTraffic(grid.bytes_sent - sent, grid.bytes_received - received, model_bytes)

