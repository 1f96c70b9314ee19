"""Basin's ClientApp: reports its partition, and trains the received model locally.

Data settings (dataset, partition scheme, seed) come from the run config; the
partition id and count from the node config (simulation: one per SuperNode;
deployment: ``--node-config "partition-id=K num-partitions=N"``). Training
hyperparameters, including the round's learning rate, come with each message.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clients.data import client_tensors
from clients.models import build_model, resolve_model_name
from clients.scaffold import DELTA_KEY, SERVER_CONTROL_KEY, ScaffoldClient
from clients.training import LocalTrainingConfig, proximal_hook, select_device, train_local
from partitions import load_dataset

app = ClientApp()


@lru_cache(maxsize=4)
def _process_model(name: str, input_shape: tuple[int, ...], num_classes: int, device: str) -> torch.nn.Module:
    """One model per client process, reused every round: each round overwrites all of its
    weights with the received ones, so only the allocation is saved."""
    return build_model(name, input_shape, num_classes).to(device)


def _partition(context: Context) -> tuple[int, int]:
    return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which partition this node holds."""
    partition_id, num_partitions = _partition(context)
    info = ConfigRecord({"partition-id": partition_id, "num-partitions": num_partitions})
    return Message(content=RecordDict({"partition": info}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Load the global model, run local SGD with the round's config, reply with the result."""
    run_config = context.run_config
    partition_id, num_partitions = _partition(context)
    round_config = msg.content["config"]
    device = select_device(str(run_config["device"]))
    x, y = client_tensors(tuple(sorted(run_config.items())), partition_id, num_partitions, str(device))

    data = load_dataset(str(run_config["dataset"]), str(run_config["data-dir"]))
    model_name = resolve_model_name(str(run_config["model"]), str(run_config["dataset"]))
    model = _process_model(model_name, data.input_shape, data.num_classes, str(device))
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())

    # The batch order depends on (seed, round, partition) only: reproducible in any engine.
    batch_seed = np.random.SeedSequence([int(round_config["seed"]), int(round_config["server-round"]), partition_id])
    generator = torch.Generator().manual_seed(int(batch_seed.generate_state(1)[0]))
    lr = float(round_config["lr"])
    hooks, scaffold = [], None
    if float(round_config.get("proximal-mu", 0.0)) > 0:
        hooks.append(proximal_hook(model, float(round_config["proximal-mu"])))
    if SERVER_CONTROL_KEY in msg.content:
        scaffold = ScaffoldClient(model, msg.content[SERVER_CONTROL_KEY], context.state)
        hooks.append(scaffold.hook)
    result = train_local(
        model, x, y,
        LocalTrainingConfig(
            lr=lr,
            local_epochs=int(round_config["local-epochs"]),
            batch_size=int(round_config["batch-size"]),
            momentum=float(round_config["momentum"]),
            weight_decay=float(round_config["weight-decay"]),
            grad_clip=float(round_config["grad-clip"]),
        ),
        generator,
        hooks,
    )
    metrics = MetricRecord({
        "num-examples": result.num_examples,
        "train-loss": result.mean_loss,
        "local-steps": result.num_steps,
    })
    reply = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    if scaffold is not None:
        metrics["client-state-norm"] = scaffold.control_norm()
        reply[DELTA_KEY] = scaffold.finish(model, result.num_steps, lr)
    return Message(content=reply, reply_to=msg)
