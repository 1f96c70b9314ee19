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
    """Tell the server which partition this node holds."""
    partition_id, num_partitions = protocol.partition_of(context)
    info = ConfigRecord({"partition-id": partition_id, "num-partitions": num_partitions})
    return Message(content=RecordDict({"partition": info}), reply_to=msg)


def full_gradient_query(msg: Message, context: Context) -> Message:
    """MIME's extra exchange: this client's mean gradient over all of its examples at the
    received model, with no update (clients/mime.py)."""
    from clients.client_work import full_gradient_reply

    return full_gradient_reply(msg, context)


def train(msg: Message, context: Context) -> Message:
    """Load the global model, run local SGD with the round's config, reply with the result."""
    from clients.client_work import train_reply

    return train_reply(msg, context)
