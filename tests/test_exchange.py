"""Basin's round exchange: every reply collected, and the timeout honoured."""

from __future__ import annotations

import time
from types import SimpleNamespace

from strategies.exchange import send_and_receive


class ScriptedGrid:
    """Replies to message k become available at the k-th pull after the push."""

    def __init__(self, num_messages: int, never: set[int] = frozenset()):
        self.num_messages, self.never, self.pulls = num_messages, never, 0

    def push_messages(self, messages):
        return [f"m{k}" for k, _ in enumerate(messages)]

    def pull_messages(self, message_ids):
        self.pulls += 1
        ready = [k for k in range(self.num_messages) if k < self.pulls and k not in self.never and f"m{k}" in message_ids]
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=f"m{k}"), has_content=lambda: False) for k in ready]


def _messages(count: int) -> list[SimpleNamespace]:
    """Stand-ins for a round's messages: the exchange reads their destination node only."""
    return [SimpleNamespace(metadata=SimpleNamespace(dst_node_id=100 + k), has_content=lambda: False) for k in range(count)]


def test_collects_every_reply_once_polling_until_the_last():
    grid = ScriptedGrid(4)
    replies = send_and_receive(grid, _messages(4), timeout=10)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1", "m2", "m3"]
    assert grid.pulls == 4
    assert replies.destinations == {"m0": 100, "m1": 101, "m2": 102, "m3": 103}  # message id → node it went to


def test_stops_at_the_timeout_with_the_replies_it_has():
    grid = ScriptedGrid(3, never={2})
    started = time.monotonic()
    replies = send_and_receive(grid, _messages(3), timeout=0.2)
    # Not before the timeout; after it, however loaded the machine (the third reply never comes).
    assert 0.2 <= time.monotonic() - started < 30.0
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1"]
