"""Basin's client: reports its partition, and trains the received model locally. The
handlers of the ClientApp (strategies/client_app.py, which hands every method's client
half over first).

Data settings (dataset, partition scheme, seed) come from the run config; the
partition id and count from the node config (simulation: one per SuperNode;
deployment: ``--node-config "partition-id=K num-partitions=N"``). Training
hyperparameters, including the round's learning rate, come with each message.

This module imports no torch (the work is in clients/client_work.py, imported with a
client's first training message): Flower's simulation process loads it before it starts
Ray and the client processes, so a light import starts them sooner.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict

from clients import protocol


def query(msg: Message, context: Context) -> Message:
    """Tell the server which partition this node holds (or its ``node-name``, if it has no
    partition id) and, for a node with its own data
    (node config ``data-path``), what that data is: its examples, input shape and largest
    label, which the server checks against the run before round 1, or why it cannot be read."""
    name = context.node_config.get(protocol.NODE_NAME)
    info = ConfigRecord({protocol.NODE_NAME: str(name)} if name else {})
    try:
        partition_id, num_partitions = protocol.partition_of(context)
        info.update({"partition-id": partition_id, "num-partitions": num_partitions})
    except (KeyError, ValueError):
        if not name:  # neither identity: the server names this node in its refusal
            raise
    path = context.node_config.get(protocol.NODE_DATA_PATH)
    if path:
        from partitions.node_data import NodeDataError, load_node_data  # datasets, no torch

        try:
            node = load_node_data(str(path))
            info.update({"examples": len(node.y_train), "input-shape": list(node.input_shape),
                         "largest-label": int(max(node.y_train.max(), -1 if node.y_test is None else node.y_test.max()))})
        except NodeDataError as error:
            info["data-problem"] = str(error)
    return Message(content=RecordDict({"partition": info}), reply_to=msg)


def full_gradient_query(msg: Message, context: Context) -> Message:
    """MIME's extra exchange: this client's mean gradient over all of its examples at the
    received model, with no update (clients/mime.py)."""
    from clients.client_work import full_gradient_reply

    protocol.adopt_assignment(msg, context)
    return full_gradient_reply(msg, context)


def train(msg: Message, context: Context) -> Message:
    """Load the global model, run local SGD with the round's config, reply with the result."""
    from clients.client_work import train_reply

    protocol.adopt_assignment(msg, context)
    return train_reply(msg, context)


def evaluate(msg: Message, context: Context) -> Message:
    """evaluation = federated: score the received models on this node's own test split."""
    from clients.client_work import evaluate_reply

    protocol.adopt_assignment(msg, context)
    return evaluate_reply(msg, context)
