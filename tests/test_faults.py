"""Faulty clients are excluded, counted and attributed; too few replies skip the round."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict

from clients.faults import InjectedFault, inject_faults, parse_faults
from strategies.averaging import ModelAveraging
from strategies.discovery import NodeDiscoveryError, discover_partitions
from strategies.exchange import send_and_receive
from strategies.fedavg import FedAvg
from strategies.reply_screening import TIMEOUT_REASON, screen_replies
from tests.fakes import FakeGrid, train_reply, train_request

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py

SENT = ArrayRecord({"w": Array(np.zeros(2, np.float32))})


def _reply(node_id, weights, n=1, **extra_records):
    return train_reply(node_id, weights, n, **extra_records)


def _error_reply(node_id, reason):
    return Message(Error(code=0, reason=reason), reply_to=train_request(node_id))


def _bound_strategy(min_replies=1, cohort=4):
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=0, min_available_nodes=0)
    strategy.bind_partitions({100 + p: p for p in range(4)}, cohort, seed=0, min_replies=min_replies)
    strategy.configure_train(1, SENT, ConfigRecord(), FakeGrid(range(100, 104)))  # cohort 4 of 4: nodes 100..103
    return strategy


def test_each_kind_of_bad_reply_is_excluded_with_its_reason():
    replies = [
        _reply(103, [1.0, 2.0]),
        _error_reply(100, "Traceback (most recent call last):\n  ...\nException ClientAppException occurred. Message: boom'>"),
        _reply(101, [np.nan, 1.0]),
        _reply(102, [1.0, 2.0, 3.0]),
    ]
    ok, failures = screen_replies(replies, {100: 0, 101: 1, 102: 2, 103: 3}, {100: 0, 101: 1, 102: 2, 103: 3}, "arrays", {"w": (2,)})
    assert [r.metadata.src_node_id for r in ok] == [103]
    assert [(f.node_id, f.partition_id) for f in failures] == [(100, 0), (101, 1), (102, 2)]
    assert failures[0].reason == "client error: boom"
    assert failures[1].reason == "non-finite values (NaN or inf) in arrays['w']"
    assert failures[2].reason == "array 'w' has shape (3,), sent (2,)"
    assert str(failures[2]) == "partition 2 (node 102): array 'w' has shape (3,), sent (2,)"


def test_inf_in_a_control_variate_missing_records_and_silence_are_failures():
    control = ArrayRecord({"w": Array(np.array([np.inf, 0.0], np.float32))})
    no_metrics = Message(content=RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(2, np.float32))})}), reply_to=train_request(11))
    renamed = _reply(12, [1.0, 2.0])
    renamed.content["arrays"] = ArrayRecord({"v": Array(np.zeros(2, np.float32))})
    replies = [_reply(10, [0.0, 0.0], control=control), no_metrics, renamed]
    sent_to = {10: 0, 11: 1, 12: 2, 13: 3}
    ok, failures = screen_replies(replies, sent_to, sent_to, "arrays", {"w": (2,)})
    assert ok == []
    assert [f.reason for f in failures] == [
        "non-finite values (NaN or inf) in control['w']",
        "reply has no MetricRecord",
        "model arrays differ from the sent model's: missing ['w'], unexpected ['v']",
        TIMEOUT_REASON,
    ]
    assert failures[3].node_id == 13  # the silent node is the one the message was sent to


def test_failed_clients_are_left_out_of_the_average_and_counted():
    strategy = _bound_strategy()
    replies = [_reply(100, [1.0, 1.0], n=1), _reply(101, [np.inf, 0.0], n=5), _reply(102, [4.0, 4.0], n=3)]
    arrays, _ = strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays["w"].numpy(), [(1 * 1 + 4 * 3) / 4] * 2)  # node 101 weighs nothing
    assert strategy.round_clients["clients-ok"] == 2 and strategy.round_clients["clients-failed"] == 2
    assert [f.partition_id for f in strategy.round_failures] == [1, 3]  # inf, and no reply from node 103
    assert strategy.round_status == "aggregated"


def test_a_round_with_fewer_accepted_replies_than_min_replies_is_skipped_and_the_window_untouched():
    component = ModelAveraging(_bound_strategy(min_replies=2), window=2, start_round=1, feedback=True)
    arrays, metrics = component.aggregate_train(1, [_reply(100, [1.0, 1.0]), _error_reply(101, "x")])
    assert arrays is None and metrics is None
    assert component.round_status == "skipped: 1 accepted replies, fewer than min-replies = 2"
    assert len(component.recent_models) == 0 and component.averaged_arrays is None


def test_min_replies_cannot_exceed_the_cohort():
    with pytest.raises(ValueError, match="min_replies"):
        _bound_strategy(min_replies=5)


def test_waiting_for_too_few_nodes_ends_with_a_clear_error():
    with pytest.raises(NodeDiscoveryError, match=r"only 2 of num-clients = 3 nodes connected within node-timeout = 0.2 s"):
        discover_partitions(FakeGrid([1, 2]), num_clients=3, timeout=0.2)


def test_fault_specs_parse_and_bad_ones_name_the_entry():
    faults = parse_faults("raise:0@2, nan:3 ,hang:1@4")
    assert [(f.kind, f.partition_id, f.server_round) for f in faults] == [("raise", 0, 2), ("nan", 3, None), ("hang", 1, 4)]
    assert faults[1].applies(3, 17) and not faults[0].applies(0, 3)
    assert parse_faults("") == []
    for bad in ("explode:1", "nan:x", "nan:1@", "nan"):
        with pytest.raises(ValueError, match="fault entry"):
            parse_faults(bad)


def test_injected_faults_change_only_the_targeted_reply():
    state = {"step": torch.tensor(3), "w": torch.zeros(2, 2)}
    assert inject_faults("nan:1@2", 1, 3, state, 1.0) is state  # another round
    poisoned = inject_faults("nan:1@2, shape:0", 1, 2, state, 1.0)
    assert torch.isnan(poisoned["w"]).sum() == 1 and poisoned["step"] is state["step"]
    assert not torch.isnan(state["w"]).any()  # the process's model is not modified
    assert inject_faults("inf:0", 0, 1, state, 1.0)["w"].isinf().sum() == 1
    assert inject_faults("shape:0", 0, 1, state, 1.0)["w"].shape == (3,)
    with pytest.raises(InjectedFault, match="partition 0 raises in round 5"):
        inject_faults("raise:0", 0, 5, state, 1.0)


class QueryGrid(FakeGrid):
    """A Grid whose nodes answer partition queries (node n holds partition n % 10), except
    ``silent`` ones; ``refused`` nodes' messages are not accepted (no message id)."""

    def __init__(self, node_ids, silent=(), refused=(), names=None):
        super().__init__(node_ids)
        self.silent, self.refused, self.replies, self.asked = set(silent), set(refused), {}, []
        self.names = names or {}  # {node: node-name}: those nodes answer with a name, no partition id

    def push_messages(self, messages):
        ids = []
        for message in messages:
            node = message.metadata.dst_node_id
            self.asked.append(node)
            if node in self.refused:
                ids.append(None)
                continue
            message.metadata.__dict__["_message_id"] = f"m{node}"
            ids.append(f"m{node}")
            if node not in self.silent:
                info = ConfigRecord({"node-name": self.names[node]} if node in self.names else
                                    {"partition-id": node % 10, "num-partitions": 4})
                self.replies[f"m{node}"] = Message(content=RecordDict({"partition": info}), reply_to=message)
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]


def test_a_restarted_node_takes_its_partition_back_and_a_silent_newcomer_is_asked_once(capsys):
    strategy = _bound_strategy()  # partitions 0..3 on nodes 100..103
    grid = QueryGrid([100, 101, 103, 112, 27], silent=[27])  # node 102 came back as 112; 27 never answers
    strategy.follow_rejoined_nodes(grid, timeout=0.2)
    assert strategy.partition_of_node == {100: 0, 101: 1, 103: 3, 112: 2}
    assert strategy.ignored_nodes == {27}
    out = capsys.readouterr().err
    assert "partitions [2] now on nodes [112] (rejoined)" in out and "new node 27 ignored: did not report" in out
    strategy.follow_rejoined_nodes(grid, timeout=0.2)
    assert grid.asked == [27, 112]  # neither is asked again
    rounds = [r for r in range(1, 30) if 2 in strategy.sample_partitions(r)]
    messages = strategy.configure_train(rounds[0], SENT, ConfigRecord(), grid)
    assert 112 in {m.metadata.dst_node_id for m in messages} and 102 not in {m.metadata.dst_node_id for m in messages}


def test_named_nodes_keep_their_partition_when_they_rejoin_and_a_new_name_is_sampled_from_the_next_round():
    """Named nodes (node-name, no partition id): ranked by name; one restarts under a new node id
    and keeps its partition (and its messages carry it); a new name joins as partition 4."""
    from strategies.exchange import ASSIGNED_PARTITIONS, with_assigned_partition

    names = {100: "d", 101: "b", 102: "a", 103: "c"}
    federation = discover_partitions(QueryGrid(list(names), names=names), num_clients=4, timeout=5)
    assert dict(federation) == {102: 0, 101: 1, 103: 2, 100: 3} and federation.names == ["a", "b", "c", "d"]
    # a resumed run keeps its checkpoint's order
    assert dict(discover_partitions(QueryGrid(list(names), names=names), 4, 5, known_names=["d", "c", "b", "a"])) == {
        100: 0, 103: 1, 101: 2, 102: 3}
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=0, min_available_nodes=0)
    strategy.bind_partitions(federation, 2, seed=0)
    grid = QueryGrid([100, 101, 103, 112, 140], names={**names, 112: "a", 140: "e"})  # a came back as 112; e is new
    strategy.follow_rejoined_nodes(grid, timeout=1)
    assert strategy.partition_of_node == {101: 1, 103: 2, 100: 3, 112: 0, 140: 4}
    assert federation.names == ["a", "b", "c", "d", "e"]  # the checkpoint's order from now on
    assert 4 in {p for r in range(1, 20) for p in strategy.sample_partitions(r)}
    message = with_assigned_partition(train_request(112))
    assert message.content["config"]["assigned-partition-id"] == 0 and ASSIGNED_PARTITIONS[140] == (4, 5)
    for named, refusal in (({**names, 101: "d"}, "nodes \\[100, 101\\] all have node-name = 'd'"),
                           ({100: "a"}, "nodes \\[101, 102, 103\\] hold partition ids and nodes \\[100\\] only a node-name")):
        with pytest.raises(NodeDiscoveryError, match=refusal):
            discover_partitions(QueryGrid(list(names), names=named), num_clients=4, timeout=5)
    ASSIGNED_PARTITIONS.clear()


def test_a_message_the_superlink_refuses_counts_as_no_reply_and_does_not_stall_the_round():
    grid = QueryGrid([1, 2], refused=[2])
    messages = [Message(content=RecordDict({"config": ConfigRecord()}), dst_node_id=n, message_type=MessageType.QUERY) for n in (1, 2)]
    started = time.monotonic()
    replies = send_and_receive(grid, messages, timeout=120.0)
    # Stalled, it would wait the whole timeout: anything well under it is not stalled, under any load.
    assert [r.metadata.src_node_id for r in replies] == [1] and time.monotonic() - started < 60.0


def test_a_round_lost_to_dead_client_processes_is_infrastructure_not_a_client_fault():
    from strategies.reply_screening import ClientFailure, infrastructure_loss

    dead = ClientFailure(101, 1, "client error: The actor is dead because its owner has died. Owner Id: 01…")
    died = ClientFailure(102, 2, "client error: ray.exceptions.ActorDiedError: The actor died unexpectedly")
    gone = ClientFailure(103, 3, "Error: Node Unavailable — The destination node failed to report a heartbeat")
    raised = ClientFailure(104, 4, "client error: injected fault: partition 4 raises in round 1")
    assert infrastructure_loss([dead, died], aggregated=False) == dead.reason
    # One dead client process among replies that arrived: the cohort is not the config's either.
    assert infrastructure_loss([raised, died], aggregated=True) == died.reason
    # A dead SuperNode among live ones is an ordinary failure; every node dead is not.
    assert infrastructure_loss([gone], aggregated=True) is None
    assert infrastructure_loss([gone], aggregated=False) == gone.reason
    assert infrastructure_loss([raised], aggregated=False) is None  # a client's own fault: a skipped round
    assert infrastructure_loss([], aggregated=True) is None


def _superlink_unavailable_reply(request):
    """The error the SuperLink writes itself for a node that stopped sending heartbeats
    (Flower's own function): its sender is the SuperLink, not the node."""
    from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message

    request.metadata.__dict__["_message_id"] = request.object_id  # as the SuperLink stores a message
    return create_message_error_unavailable_res_message(request.metadata, "node_unavail")


class _RecordingGrid(FakeGrid):
    """A Grid whose nodes 100, 101 and 103 answer and node 102 is dead (the SuperLink answers for it)."""

    def push_messages(self, messages):
        self.requests = {}
        for message in messages:
            message.metadata.__dict__["_message_id"] = message.object_id
            self.requests[message.object_id] = message
        return list(self.requests)

    def pull_messages(self, ids):
        replies = []
        for message_id in ids:
            request = self.requests[message_id]
            node = request.metadata.dst_node_id
            replies.append(_superlink_unavailable_reply(request) if node == 102 else
                           Message(content=RecordDict({"arrays": ArrayRecord({"w": Array(np.ones(2, np.float32))}),
                                                       "metrics": MetricRecord({"num-examples": 1})}), reply_to=request))
        return replies


@pytest.mark.parametrize("dead_nodes", ["sample", "skip"])
def test_a_dead_supernode_is_one_failure_under_its_partition_with_flowers_reason(dead_nodes):
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=0, min_available_nodes=0)
    strategy.bind_partitions({100 + p: p for p in range(4)}, 3, seed=0, skip_unavailable=dead_nodes == "skip")
    grid = _RecordingGrid(range(100, 104))
    drawn = []  # rounds whose cohort holds the dead node's partition 2
    for server_round in range(1, 6):
        cohort = strategy.sample_partitions(server_round)
        drawn += [server_round] if 2 in cohort else []
        replies = send_and_receive(grid, strategy.configure_train(server_round, SENT, ConfigRecord(), grid), timeout=1.0)
        strategy.aggregate_train(server_round, replies)
        failures = strategy.round_failures
        if 2 in cohort:  # partition 2's node is dead: one failure, its own, with Flower's reason
            assert [(f.node_id, f.partition_id) for f in failures] == [(102, 2)]
            assert "Node Unavailable" in failures[0].reason
        else:
            assert failures == []
    assert strategy.unavailable_nodes == {102}
    # sample: the seeded cohorts of the config (partition 2 in rounds 1, 3, 4, 5); skip: left
    # out once Flower reported its node unavailable (round 1).
    assert drawn == ([1, 3, 4, 5] if dead_nodes == "sample" else [1])
