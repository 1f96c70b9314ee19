"""Basin's round exchange: every reply collected, and the timeout honoured."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

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


class DeploymentGrid:
    """A deployment's grid (Flower's ``HttpGrid``) on a scripted SuperLink holding two
    replies: node 0's from the first pull, whose last array never arrives (its SuperNode froze
    mid-upload; or, with ``expired``, the SuperLink's object-push session has expired, so the
    array is gone), and node 1's, complete, from ``healthy_after`` seconds after the push."""

    def __init__(self, healthy_after: float, expired: bool = False):
        from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
        from flwr.common.serde import message_to_proto
        from flwr.proto.node_pb2 import Node
        from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree
        from flwr.superlink.grid.http_grid import HttpGrid

        self.replies = []
        for node in (0, 1):
            request = Message(content=RecordDict({"config": ConfigRecord()}), dst_node_id=node,
                              message_type=MessageType.TRAIN)
            request.metadata.__dict__["_message_id"] = request.object_id
            reply = Message(content=RecordDict({"arrays": ArrayRecord({"w": Array(np.full(3, node, np.float32))})}),
                            reply_to=request)
            reply.metadata.__dict__["_message_id"] = reply.object_id
            objects = {object_id: value.deflate() for object_id, value in get_all_nested_objects(reply).items()}
            self.replies.append(SimpleNamespace(request=request, proto=message_to_proto(reply),
                                                tree=get_object_tree(reply), objects=objects))
        self.frozen_object = list(self.replies[0].objects)[0]  # an array's: the message object comes last
        self.expired, self.healthy_after, self.handed_out = expired, healthy_after, set()
        self.error_objects: dict[str, bytes] = {}
        self.grid = HttpGrid.__new__(HttpGrid)
        self.grid._run, self.grid.node, self.grid._client = SimpleNamespace(run_id=1), Node(node_id=1), self

    def push(self) -> None:
        self.pushed_at = time.monotonic()

    def PullMessages(self, request):  # noqa: N802 (Flower's runtime client's names)
        from flwr.common.serde import message_to_proto
        from flwr.proto.runtime_pb2 import PullAppMessagesResponse
        from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_ins_message
        from flwr.supercore.inflatable.inflatable_object import get_object_tree

        arrived = [0] + ([1] if time.monotonic() - self.pushed_at >= self.healthy_after else [])
        ready = [self.replies[node] for node in arrived if node not in self.handed_out
                 and self.replies[node].request.metadata.message_id in request.message_ids]
        messages, trees = [reply.proto for reply in ready], [reply.tree for reply in ready]
        # The SuperLink hands a reply out once: asked again, it answers as Flower's does.
        for node in self.handed_out:
            if (asked := self.replies[node].request.metadata.message_id) in request.message_ids:
                error = create_message_error_unavailable_ins_message(asked, run_id=1)
                self.error_objects[error.object_id] = error.deflate()
                messages.append(message_to_proto(error))
                trees.append(get_object_tree(error))
        self.handed_out.update(arrived)
        return PullAppMessagesResponse(messages_list=messages, message_object_trees=trees)

    def PullObject(self, request):  # noqa: N802
        from flwr.proto.message_pb2 import PullObjectResponse

        if request.object_id == self.frozen_object:
            return PullObjectResponse(object_found=not self.expired, object_available=False)
        content = self.error_objects.get(request.object_id) or next(
            reply.objects[request.object_id] for reply in self.replies if request.object_id in reply.objects)
        return PullObjectResponse(object_found=True, object_available=True, object_content=content)

    def ConfirmMessageReceived(self, request):  # noqa: N802
        return None


def _exchange_in_a_thread(grid: DeploymentGrid, timeout: float) -> tuple[list, float]:
    """send_and_receive on ``grid``'s two requests (its push scripted): the replies and the
    seconds it took; fails if it still waits after 60 s (a hang guard only)."""
    import threading

    def push_messages(messages):
        grid.push()
        return [message.metadata.message_id for message in messages]

    grid.grid.push_messages = push_messages
    done: dict = {}

    def exchange():
        started = time.monotonic()
        done["replies"] = send_and_receive(grid.grid, [reply.request for reply in grid.replies], timeout)
        done["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=exchange, daemon=True)
    thread.start()
    thread.join(60)
    grid.expired = True  # a pull still waiting ends: the array is gone
    assert not thread.is_alive(), "the exchange still waited for the frozen node's reply after 60 s"
    return done["replies"], done["seconds"]


@pytest.mark.usefixtures("server_identity")
def test_a_deployments_round_waits_for_a_reply_frozen_mid_upload_until_its_timeout_only_and_keeps_the_others():
    """A SuperNode frozen while uploading its reply's arrays: Flower's pull waits for them
    until the object-push session expires (180 s); the round ends at its timeout with the
    healthy node's reply, which arrived while the frozen one's arrays were awaited, and
    without the frozen one (no reply in time)."""
    replies, seconds = _exchange_in_a_thread(DeploymentGrid(healthy_after=0.3), timeout=1.0)
    assert seconds >= 1.0
    assert [reply.metadata.src_node_id for reply in replies] == [1] and not replies[0].has_error()
    assert replies[0].content["arrays"]["w"].numpy().tolist() == [1.0, 1.0, 1.0]


@pytest.mark.usefixtures("server_identity")
def test_a_reply_whose_arrays_the_superlink_no_longer_holds_is_flowers_error_reply_without_a_wait():
    grid = DeploymentGrid(healthy_after=0.0, expired=True)
    replies, seconds = _exchange_in_a_thread(grid, timeout=30.0)
    assert seconds < 30.0 and [reply.has_error() for reply in replies] == [True, False]
    assert replies[0].metadata.reply_to_message_id == grid.replies[0].request.metadata.message_id
    assert "Reply message objects are unavailable" in replies[0].error.reason


@pytest.mark.usefixtures("server_identity")
def test_on_another_flower_a_deployments_replies_are_pulled_by_flowers_own_code(monkeypatch, capsys):
    from clients import flower_internals

    grid = DeploymentGrid(healthy_after=0.0)
    grid.grid.pull_messages = lambda message_ids: ["Flower's pull"]
    monkeypatch.setattr(flower_internals.releases, "installed_flower", lambda: "9.9.9")
    flower_internals.bounded_reply_pulls_available.cache_clear()
    try:
        assert flower_internals.pull_replies(grid.grid, ["m0"], time.monotonic()) == (["Flower's pull"], set())
    finally:
        flower_internals.bounded_reply_pulls_available.cache_clear()
    assert "replies are pulled by Flower's own code" in capsys.readouterr().err
