"""What a client does with a training or MIME gradient message: the ClientApp's work.

Kept apart from clients/handlers.py so that loading the ClientApp imports no torch:
Flower's simulation process loads the ClientApp before it starts Ray, and that import
(~2 s on 2 CPU cores) delayed every run's client processes. A client process imports
this module with its first message.
"""

from __future__ import annotations

import time
from functools import lru_cache

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from clients import protocol
from clients.arithmetic import fix_arithmetic
from clients.client_info import ClientInfo
from clients.data import client_tensors, node_tensors
from clients.faults import inject_faults
from clients.halves import installed
from clients.local_round import LocalRound, round_randomness, training_config
from clients.log import log
from clients.memory_format import CHANNELS_LAST, memory_format
from clients.mime import full_gradient
from clients.models import build_model, resolve_model_name, uses_projection_head
from clients.protocol import partition_of
from clients.state_store import ClientStateStore, last_checkpoint_round
from clients.system_speed import message_bytes, simulated_work
from clients.training import evaluate, select_device
from partitions.datasets import load_dataset


class ClientStateLost(RuntimeError):
    """A stateful node that trained before has none of its client state (a restarted node
    whose client-state-dir is gone): its reply stops the run (strategies/server_work.py)."""


@lru_cache(maxsize=4)
def _process_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, projection_head: bool, device: str,
    layout: torch.memory_format,
) -> torch.nn.Module:
    """One model per client process, in ``layout``, reused every round: each round overwrites
    all of its weights with the received ones, so only the allocation is saved."""
    return build_model(name, input_shape, num_classes, projection_head).to(device).to(memory_format=layout)


def _received_model_and_data(
    msg: Message, context: Context, model_record: str = protocol.MODEL_RECORD,
) -> tuple[torch.device, torch.nn.Module, tuple[torch.Tensor, ...], int]:
    """(device, the process's model holding the weights of the message's ArrayRecord
    ``model_record``, this partition's training x, y and held-out x, y on the device:
    clients/data.py's client_tensors, the data set's number of classes)."""
    run_config = context.run_config
    partition_id, num_partitions = partition_of(context)
    device = select_device(str(run_config["device"]))
    fix_arithmetic(int(run_config["torch-threads"]), device, bool(run_config["cuda-deterministic"]))
    model_name = resolve_model_name(str(run_config["model"]), str(run_config["dataset"]))
    layout = memory_format(model_name, device.type)  # the model's and its inputs' alike
    node_data = context.node_config.get(protocol.NODE_DATA_PATH)
    if node_data:  # the node's own data on its disk
        tensors, num_classes = node_tensors(str(node_data), tuple(sorted(run_config.items())), partition_id, str(device),
                                            layout)
        input_shape = tuple(tensors[0].shape[1:])
    else:
        tensors = client_tensors(tuple(sorted(run_config.items())), partition_id, num_partitions, str(device), layout)
        data = load_dataset(str(run_config["dataset"]), str(run_config["data-dir"]), bool(run_config["normalize"]))
        input_shape, num_classes = data.input_shape, data.num_classes
    projection_head = uses_projection_head(model_name, str(run_config["strategy"]))
    model = _process_model(model_name, input_shape, num_classes, projection_head, str(device), layout)
    model.load_state_dict(msg.content[model_record].to_torch_state_dict())
    return device, model, tensors, num_classes


def evaluate_reply(msg: Message, context: Context) -> Message:
    """evaluation = federated: the message's models (strategies/federated_evaluation.py) on
    this node's test split, its data's own or its seeded hold-out (clients/data.py)."""
    _, model, (_, _, x_test, y_test), _ = _received_model_and_data(msg, context, protocol.EVALUATED_BASE_MODEL)
    if not len(y_test):
        raise ValueError("this node has no test split to evaluate on (its data has no test split and "
                         "client-evaluation = 0 holds none of its examples out)")
    metrics: dict[str, float] = {protocol.EVALUATED_EXAMPLES: len(y_test)}
    for name in (protocol.EVALUATED_BASE_MODEL, protocol.EVALUATED_AVERAGED_MODEL):
        if name in msg.content.array_records:
            model.load_state_dict(msg.content[name].to_torch_state_dict())
            metrics[f"{name}-loss"], metrics[f"{name}-accuracy"] = evaluate(model, x_test, y_test)
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


def full_gradient_reply(msg: Message, context: Context) -> Message:
    """MIME's extra exchange: this client's mean gradient over all of its examples at the
    received model, with no update (clients/mime.py)."""
    _, model, (x, y, _, _), _ = _received_model_and_data(msg, context)
    return gradient_reply(msg, model, x, y)


def gradient_reply(msg: Message, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Message:
    """The reply to MIME's extra exchange from a model holding the received weights and the
    client's training examples."""
    gradient = full_gradient(model, x, y)
    reply = RecordDict({protocol.FULL_GRADIENT_RECORD: ArrayRecord({k: v.cpu() for k, v in gradient.items()}),
                        "metrics": MetricRecord({"num-examples": len(y)})})
    return Message(content=reply, reply_to=msg)


def train_reply(msg: Message, context: Context) -> Message:
    """Load the global model, run local SGD with the round's config, reply with the result."""
    started = time.time()
    device, model, tensors, num_classes = _received_model_and_data(msg, context)
    return training_reply(msg, context, started, device, model, tensors, num_classes)


def training_reply(msg: Message, context: Context, started: float, device: torch.device, model: torch.nn.Module,
                   tensors: tuple[torch.Tensor, ...], num_classes: int) -> Message:
    """The reply to a training message from a model holding the received weights and this
    client's training x, y and held-out x, y (``started``: when the client took the message)."""
    run_config = context.run_config
    partition_id, _ = partition_of(context)
    round_config = msg.content["config"]
    x, y, x_held_out, y_held_out = tensors
    work = simulated_work(round_config, training_config(round_config).planned_steps(len(y)), message_bytes(msg.content))
    if work is not None and work.late:  # dropped at the deadline: no work, its client state untouched
        late = {protocol.LATE: 1.0, protocol.SIMULATED_SECONDS: work.seconds, protocol.PLANNED_STEPS: work.planned,
                "num-examples": len(y)}
        return Message(content=RecordDict({"metrics": MetricRecord(late)}), reply_to=msg)
    if work is not None and work.steps < work.planned:  # partial work: the steps it has time for
        round_config[protocol.STEP_BUDGET] = work.steps
    # client-evaluation: the received model on this client's held-out split, before it trains
    # (with federated evaluation the server asks for it after aggregation instead)
    held_out = {}
    if len(y_held_out) and run_config.get("evaluation", "central") == "central":
        loss, accuracy = evaluate(model, x_held_out, y_held_out)
        held_out = {protocol.HELD_OUT_ACCURACY: accuracy, protocol.HELD_OUT_LOSS: loss,
                    protocol.HELD_OUT_EXAMPLES: len(y_held_out)}

    server_round = int(round_config["server-round"])
    snapshots = ClientStateStore.for_round(round_config, context.node_config, partition_id)
    resumed_after = int(round_config.get(protocol.RESUMED_AFTER_ROUND, 0))
    attempt = str(round_config.get(protocol.CLIENT_STATE_ATTEMPT, ""))
    if snapshots and not context.state:  # this node's first round of a resumed run, or a restarted node's
        restored = snapshots.restore(context.state, resumed_after, server_round, attempt)
        trained = int(round_config.get(protocol.CLIENT_STATE_TRAINED_ROUND, 0))
        if trained and (restored is None or restored < trained):
            raise ClientStateLost(
                f"partition {partition_id} trained in round {trained}, but neither its memory nor "
                f"{snapshots.directory} holds its client state of that round or later: this node lost it; put its "
                f"client-state-dir back, or start the run afresh (resume = false)")
        if restored is not None and restored > resumed_after:
            log.info(f"partition {partition_id}: a new process; its client state of round {restored} restored "
                     f"from {snapshots.directory}")

    generator, rng = round_randomness(int(round_config["seed"]), server_round, partition_id)
    declared = installed().option_keys.get(str(run_config["strategy"]), ())
    client = ClientInfo.of(y, num_classes, partition_id, str(run_config["dataset"]), server_round,
                           {key: run_config[key] for key in declared})
    local_round = LocalRound(model, msg.content, context.state, rng, client)
    result = local_round.train(model, x, y, generator)
    metrics, records = local_round.finish(model, result)
    if snapshots:
        every = int(round_config[protocol.CHECKPOINT_EVERY])
        snapshots.save(context.state, server_round, last_checkpoint_round(server_round, every, resumed_after), attempt)
    metrics.update({**held_out, **process_usage(started, device)})
    if work is not None:
        metrics.update({protocol.SIMULATED_SECONDS: work.seconds, protocol.PLANNED_STEPS: work.planned})
    trained_in = memory_format(resolve_model_name(str(run_config["model"]), str(run_config["dataset"])), device.type)
    metrics[protocol.CHANNELS_LAST] = float(trained_in == CHANNELS_LAST)
    state = model.state_dict()
    if run_config["fault-injection"]:
        state = inject_faults(
            str(run_config["fault-injection"]), partition_id, server_round, state,
            float(run_config["round-timeout"]),
        )
    reply = RecordDict({protocol.MODEL_RECORD: ArrayRecord(state), "metrics": MetricRecord(metrics), **records})
    return Message(content=reply, reply_to=msg)


def process_usage(started: float, device: torch.device) -> dict[str, float]:
    """When this client worked (wall clock, so the server can tell its own overhead apart)
    and, on CUDA, the peak memory its process has allocated (data, model and activations)."""
    usage = {protocol.TRAIN_START: started, protocol.TRAIN_END: time.time()}
    if device.type == "cuda":
        usage[protocol.GPU_PEAK_MIB] = torch.cuda.max_memory_allocated(device) / 2**20
    return usage
