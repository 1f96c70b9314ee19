"""A Flower Grid whose nodes are Basin's ClientApp handlers called in this process: the
server half's messages go through the client half's real code and back, with no SuperLink,
no simulation engine and no Ray. The tests' compositions (tests/test_compositions.py) run on
it, and ``experiments.costs`` measures a round's traffic on it with a client that trains on
synthetic examples (experiments/measurement/method_traffic.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flwr.app import Context, Error, Message, MessageType, RecordDict

from clients import protocol
from strategies import client_app
from strategies.exchange import array_bytes

# What a ClientApp's handler raised becomes an error reply with this code, as Flower's
# ClientApp error replies have a code and the exception as their reason.
CLIENT_APP_EXCEPTION = 2

Handler = Callable[[Message, Context], Message]
# The ClientApp's handlers by message type (MIME's extra exchange is a query with an action).
CLIENT_APP_HANDLERS: Mapping[str, Handler] = {
    MessageType.TRAIN: client_app.train,
    MessageType.QUERY: client_app.query,
    MessageType.EVALUATE: client_app.evaluate,
    f"{MessageType.QUERY}.{protocol.FULL_GRADIENT_ACTION}": client_app.full_gradient_query,
}


class InProcessGrid:
    """Nodes ``100 + p`` for partitions p of ``num_partitions``, each with its own
    ``context.state`` across rounds, answering with ``handlers`` (default: the ClientApp's);
    ``bytes_sent`` and ``bytes_received`` count the arrays of every message pushed and every
    reply pulled, as a round's traffic is counted."""

    def __init__(self, run_config: Mapping[str, Any], num_partitions: int,
                 handlers: Mapping[str, Handler] = CLIENT_APP_HANDLERS) -> None:
        self.contexts = {
            100 + p: Context(run_id=1, node_id=100 + p, node_config={"partition-id": p, "num-partitions": num_partitions},
                             state=RecordDict(), run_config=dict(run_config))
            for p in range(num_partitions)
        }
        self.handlers = handlers
        self.replies: dict[str, Message] = {}
        self.ids = itertools.count()
        self.bytes_sent = self.bytes_received = 0

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for message in messages:
            message_id = f"m{next(self.ids)}"
            message.metadata.__dict__["_message_id"] = message_id
            self.bytes_sent += array_bytes(message)
            context = self.contexts[message.metadata.dst_node_id]
            try:
                reply = self.handlers[message.metadata.message_type](message, context)
            except Exception as error:  # the ClientApp's error reply
                reply = Message(Error(CLIENT_APP_EXCEPTION, f"{type(error).__name__}: {error}"), reply_to=message)
            self.replies[message_id] = reply
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        pulled = [self.replies.pop(message_id) for message_id in list(message_ids) if message_id in self.replies]
        self.bytes_received += sum(array_bytes(reply) for reply in pulled)
        return pulled
