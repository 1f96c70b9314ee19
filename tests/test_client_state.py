"""Client state snapshots (clients/state_store.py): what a resumed run hands its clients."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from clients import protocol
from clients.state_store import (
    ClientStateStore,
    discard_snapshots_after,
    last_checkpoint_round,
    remove_run_snapshots,
    snapshot_rounds,
)


def _state(value: float) -> RecordDict:
    return RecordDict({
        protocol.SCAFFOLD_CLIENT_CONTROL: ArrayRecord({"w": torch.tensor([value, value / 3]), "b": torch.tensor([1e-8])}),
        "a-config": ConfigRecord({"kept": False}),  # only ArrayRecords are client state
    })


def test_last_checkpoint_round_is_the_last_multiple_before_the_round_or_the_resume_point():
    # checkpoint-every = 2: while round 5 runs, round 4's checkpoint is the newest.
    assert [last_checkpoint_round(r, 2, 0) for r in (1, 2, 3, 4, 5)] == [0, 0, 2, 2, 4]
    # Resumed after round 3 with checkpoint-every = 5: round 3's checkpoint until round 5's.
    assert [last_checkpoint_round(r, 5, 3) for r in (4, 5, 6, 7)] == [3, 3, 5, 5]


def test_a_snapshot_restores_the_state_bit_for_bit(tmp_path):
    store = ClientStateStore(tmp_path / "run" / "partition-0")
    written = _state(0.1)
    store.save(written, server_round=3, last_checkpoint=2)
    restored = RecordDict()
    assert store.restore(restored, resumed_after=4) == 3
    assert list(restored) == [protocol.SCAFFOLD_CLIENT_CONTROL]
    for key, tensor in written[protocol.SCAFFOLD_CLIENT_CONTROL].to_torch_state_dict().items():
        assert torch.equal(restored[protocol.SCAFFOLD_CLIENT_CONTROL].to_torch_state_dict()[key], tensor)
    assert not list((tmp_path / "run" / "partition-0").glob("*.tmp"))


def test_restore_takes_the_newest_snapshot_up_to_the_checkpoint(tmp_path):
    store = ClientStateStore(tmp_path)
    for server_round in (1, 3, 4):
        store.save(_state(float(server_round)), server_round, last_checkpoint=0)
    state = RecordDict()
    assert store.restore(state, resumed_after=3) == 3  # round 4 came after the checkpoint
    assert state[protocol.SCAFFOLD_CLIENT_CONTROL]["w"].numpy().tolist() == [3.0, 1.0]
    assert store.restore(RecordDict(), resumed_after=0) is None  # had not trained before it


def test_a_restarted_node_takes_its_newest_earlier_snapshot_of_this_attempt_or_up_to_the_checkpoint(tmp_path):
    """A SuperNode restarted mid-run (empty state) continues from its last trained round; after
    a resume, a killed run's snapshot past the checkpoint (another attempt's) is skipped."""
    store = ClientStateStore(tmp_path)
    store.save(_state(2.0), 2, last_checkpoint=0, attempt="killed")
    store.save(_state(4.0), 4, last_checkpoint=2, attempt="killed")  # after checkpoint 2: the killed run's
    store.save(_state(5.0), 5, last_checkpoint=2, attempt="resumed")
    state = RecordDict()
    assert store.restore(state, resumed_after=2, server_round=5, attempt="resumed") == 2  # not round 4's
    assert state[protocol.SCAFFOLD_CLIENT_CONTROL]["w"].numpy().tolist()[0] == 2.0
    assert store.restore(RecordDict(), resumed_after=2, server_round=6, attempt="resumed") == 5
    assert store.restore(RecordDict(), resumed_after=0, server_round=5, attempt="killed") == 4  # never a later round's


def test_only_snapshots_a_later_resume_could_need_are_kept(tmp_path):
    store = ClientStateStore(tmp_path)
    for server_round, checkpointed in ((1, 0), (2, 0), (5, 4), (6, 4), (7, 6)):
        store.save(_state(1.0), server_round, checkpointed)
    # While round 7 runs the newest checkpoint is 6: snapshot 6 (the newest ≤ 6) and 7 stay.
    assert sorted(snapshot_rounds(tmp_path)) == [6, 7]
    store.save(_state(1.0), 9, last_checkpoint=8)  # checkpoint 8: the client's state is still round 7's
    assert sorted(snapshot_rounds(tmp_path)) == [7, 9]


def test_the_store_is_the_nodes_directory_when_the_node_names_one(tmp_path):
    round_config = {protocol.CLIENT_STATE_ROOT: str(tmp_path / "server"), protocol.CLIENT_STATE_RUN: "ab12"}
    assert ClientStateStore.for_round({"lr": 0.1}, {}, 3) is None  # stateless method or no checkpoints
    assert ClientStateStore.for_round(round_config, {}, 3).directory == tmp_path / "server" / "ab12" / "partition-3"
    node_config = {protocol.NODE_CLIENT_STATE_DIR: str(tmp_path / "node")}
    assert ClientStateStore.for_round(round_config, node_config, 3).directory == tmp_path / "node" / "ab12" / "partition-3"


def test_a_resume_discards_what_the_killed_run_wrote_after_its_checkpoint(tmp_path):
    run = tmp_path / "client-state" / "ab12"
    for partition, rounds in ((0, (1, 3)), (1, (2, 4))):
        for server_round in rounds:
            ClientStateStore(run / f"partition-{partition}").save(_state(1.0), server_round, last_checkpoint=0)
    discard_snapshots_after(run, resumed_after=2)
    assert [sorted(snapshot_rounds(run / f"partition-{p}")) for p in (0, 1)] == [[1], [2]]
    remove_run_snapshots(run)
    assert not (tmp_path / "client-state").exists()


def test_float64_state_survives(tmp_path):
    store = ClientStateStore(tmp_path)
    state = RecordDict({protocol.FEDDYN_CLIENT_GRADIENT: ArrayRecord([np.array([1 / 3], dtype=np.float64)])})
    store.save(state, 1, 0)
    restored = RecordDict()
    store.restore(restored, 1)
    assert restored[protocol.FEDDYN_CLIENT_GRADIENT].to_numpy_ndarrays()[0].tolist() == [1 / 3]
