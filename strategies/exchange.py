"""Send a round's messages and collect the replies, polling the Grid finely.

Flower's ``Grid.send_and_receive`` sleeps a fixed interval between pulls (0.1 s in the
simulation's in-memory Grid, 3 s over HTTP). A round of a small model can take less than
that, so the fixed sleep became most of Basin's per-round overhead. This loop uses the
Grid's own ``push_messages``/``pull_messages`` and backs off from 1 ms to ``max_poll``
seconds: short rounds end within a millisecond or two of the last reply, long rounds
cost one cheap pull every ``max_poll`` seconds. In a simulation the wait between pulls
ends as soon as the engine stores a reply (clients/simulation_engine.py), so the last
reply is pulled when it is stored, not up to ``max_poll`` later. In a deployment a reply's
arrays are awaited until the round's deadline at most (``pull_replies``), and one last
pull at the deadline takes every reply that is there by then.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from clients import protocol
from clients.flower_internals import pull_replies
from clients.simulation_engine import expect_replies, wait_for_reply
from clients.system_speed import message_bytes


@dataclass
class Traffic:
    """Bytes of arrays sent to and received from clients (a round's, or a run's): what each
    message's ArrayRecords hold, the model and every tensor a method sends beside it
    (SCAFFOLD's controls, FedFA's anchors, MIME's gradients)."""

    sent: int = 0
    received: int = 0


# Every exchange of this process adds to it; the ServerApp reads it once a round.
TRAFFIC = Traffic()
# {node id: (partition id, number of partitions)} of a federation of named nodes
# (strategies/discovery.py), set by the cohort's sampling: every message to one carries its own.
ASSIGNED_PARTITIONS: dict[int, tuple[int, int]] = {}
def with_assigned_partition(message: Message) -> Message:
    """``message``, carrying its named node's partition id in its config where it has one."""
    assigned = ASSIGNED_PARTITIONS.get(message.metadata.dst_node_id)
    if assigned is None:
        return message
    return with_config_entries(message, {protocol.ASSIGNED_PARTITION: assigned[0],
                                         protocol.ASSIGNED_PARTITIONS: assigned[1]})


def with_config_entries(message: Message, own: dict[str, int]) -> Message:
    """``message`` with ``own`` entries added to its config, for its node alone: its content is
    replaced, not changed (Flower's strategies send one content to all nodes)."""
    content = message.content
    config = content.config_records.get("config")
    entries = {**(dict(config) if config is not None else {}), **own}
    message.content = RecordDict({**{name: record for name, record in content.items() if name != "config"},
                                  "config": ConfigRecord(entries)})
    return message


def array_bytes(message: Message) -> int:
    """The bytes of the arrays a message carries (0 for an error reply)."""
    return message_bytes(message.content) if message.has_content() else 0


class Replies(list):
    """A round's replies, and ``destinations``: the node each sent message went to, by
    message id. An error reply that the SuperLink writes itself (Flower's "Node
    Unavailable" for a node that stopped sending heartbeats) names the SuperLink as its
    sender; its ``reply_to_message_id`` finds the node it stands for."""

    def __init__(self, replies: Iterable[Message] = (), destinations: dict[str, int] | None = None):
        super().__init__(replies)
        self.destinations = destinations or {}


def send_and_receive(grid: Grid, messages: Iterable[Message], timeout: float, max_poll: float = 0.02) -> Replies:
    """Push ``messages``; return the replies that arrive within ``timeout`` seconds."""
    messages = [with_assigned_partition(message) for message in messages]
    # A message the SuperLink did not accept gets no id (None): its node simply never replies.
    ids = list(grid.push_messages(messages))
    TRAFFIC.sent += sum(array_bytes(message) for message, message_id in zip(messages, ids) if message_id)
    destinations = {message_id: message.metadata.dst_node_id for message_id, message in zip(ids, messages) if message_id}
    pending = set(destinations)
    deadline = time.monotonic() + timeout
    replies = Replies(destinations=destinations)
    poll = 0.001
    while pending:
        expect_replies()
        pull_started = time.monotonic()
        pulled, left_out = pull_replies(grid, pending, deadline)
        TRAFFIC.received += sum(array_bytes(reply) for reply in pulled)
        replies.extend(pulled)
        # a reply left out (its arrays not in by the deadline) is not asked for again: no reply in time
        pending.difference_update({reply.metadata.reply_to_message_id for reply in pulled} | left_out)
        # The last pull starts at the deadline or after it: a reply that arrived while an
        # earlier pull waited for another reply's arrays is still taken.
        if not pending or pull_started >= deadline:
            break
        # in a simulation: until the engine stores a reply
        wait_for_reply(min(poll, max(deadline - time.monotonic(), 0.0)))
        poll = min(2 * poll, max_poll)
    return replies
