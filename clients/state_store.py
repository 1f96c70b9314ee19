"""Client state that outlives a run: snapshots of ``context.state`` for checkpoint/resume.

Stateful methods keep tensors on each client across rounds (SCAFFOLD's and FedMoSWA's
c_i, FedDyn's gradient, MOON's previous model). A resumed run (strategies/checkpoint.py)
is a new Flower run whose ClientApps start with an empty ``context.state``; to continue
exactly, every client needs the state it had when the server's checkpoint was written.

So after each round it trains in, a stateful client writes its state to
``DIR/round-R.pt`` (atomically), where DIR is ``ROOT/RUN/partition-K``: ROOT the server's
``output-dir/client-state`` (or the node's own ``client-state-dir`` node-config entry, for
SuperNodes that do not share the server's disk) and RUN a token the checkpoint keeps, so
a fresh run never reads an older run's files. When a resumed run first reaches a client,
the client loads its newest snapshot of a round ≤ the checkpoint's round. A SuperNode that
restarts mid-run (a new process, an empty ``context.state``) loads its newest snapshot of an
earlier round the same way, taking a round after the checkpoint only where this start of
the ServerApp (its attempt token) wrote it: a node keeps its state on its own disk
(``client-state-dir``), where a resumed server cannot discard what a killed run wrote. Snapshots are
pruned to the ones a later resume could need: the newest one up to the server's last
checkpoint and those after it (at most ``checkpoint-every`` + 1 per client).
"""

from __future__ import annotations

import io
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, RecordDict

from clients import protocol
from clients.atomic_files import write_atomically

CLIENT_STATE_DIR = "client-state"  # in the server's output-dir
SNAPSHOT = re.compile(r"round-(\d+)\.pt")


def stored_or_zeros(state: RecordDict, key: str, like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The client-state ArrayRecord ``key`` as tensors on ``like``'s device, or zeros shaped
    like ``like`` before the client's first round (SCAFFOLD's c_i, FedDyn's gradient, AdaBest's h_i)."""
    stored = state.get(key)
    if stored is None:
        return {name: torch.zeros_like(value) for name, value in like.items()}
    device = next(iter(like.values())).device
    return {name: value.to(device) for name, value in stored.to_torch_state_dict().items()}


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` of ``obj`` to ``path``, atomically (:func:`write_atomically`). Serialized
    in memory first: torch's own file writer reports a full disk as an unspecific
    ``RuntimeError`` (\"iostream error\"), Python's write as ENOSPC."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    write_atomically(Path(path), buffer.getbuffer())


def last_checkpoint_round(server_round: int, checkpoint_every: int, resumed_after: int) -> int:
    """The newest round the server has a checkpoint of while round ``server_round`` runs:
    the last multiple of ``checkpoint-every`` before it, or the round this run resumed after."""
    return max(resumed_after, (server_round - 1) // checkpoint_every * checkpoint_every)


def snapshot_rounds(directory: Path) -> dict[int, Path]:
    """{round: snapshot file} in ``directory``."""
    if not directory.is_dir():
        return {}
    return {
        int(match.group(1)): path
        for path in directory.iterdir()
        if (match := SNAPSHOT.fullmatch(path.name))
    }


class ClientStateStore:
    """The snapshots of one partition's ``context.state`` (its ArrayRecords)."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)

    @classmethod
    def for_round(
        cls, round_config: Mapping[str, Any], node_config: Mapping[str, Any], partition_id: int
    ) -> ClientStateStore | None:
        """The store a training message asks for, or None (stateless method, no checkpoints)."""
        if protocol.CLIENT_STATE_RUN not in round_config:
            return None
        root = node_config.get(protocol.NODE_CLIENT_STATE_DIR, round_config[protocol.CLIENT_STATE_ROOT])
        return cls(Path(str(root)) / str(round_config[protocol.CLIENT_STATE_RUN]) / f"partition-{partition_id}")

    def save(self, state: RecordDict, server_round: int, last_checkpoint: int, attempt: str = "") -> None:
        """Write the state after ``server_round`` (by the ServerApp start ``attempt``); drop
        snapshots no resume can need any more (those older than the newest one of a round ≤
        ``last_checkpoint``)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        records = {key: record.to_torch_state_dict() for key, record in state.items() if isinstance(record, ArrayRecord)}
        atomic_save({"attempt": attempt, "records": records}, self.directory / f"round-{server_round}.pt")
        rounds = snapshot_rounds(self.directory)
        kept = max((r for r in rounds if r <= last_checkpoint), default=None)
        for r, path in rounds.items():
            if kept is not None and r < kept:
                path.unlink(missing_ok=True)

    def restore(self, state: RecordDict, resumed_after: int, server_round: int = 0, attempt: str = "") -> int | None:
        """Fill ``state`` from the newest snapshot of a round ≤ ``resumed_after`` or, before
        ``server_round``, one that ``attempt`` wrote (a node restarted mid-run); return that
        round (None: the client had not trained before, its state stays empty)."""
        for newest in sorted(snapshot_rounds(self.directory), reverse=True):
            if newest > resumed_after and (newest >= server_round or not attempt):
                continue
            payload = torch.load(self.directory / f"round-{newest}.pt", weights_only=True)
            if "records" not in payload:  # an earlier release's snapshot: the records alone, no attempt
                payload = {"attempt": "", "records": payload}
            if newest > resumed_after and payload["attempt"] != attempt:  # a killed run's, after its checkpoint
                continue
            for key, tensors in payload["records"].items():
                state[key] = ArrayRecord(tensors)
            return newest
        return None


def discard_snapshots_after(run_directory: Path, resumed_after: int) -> None:
    """Remove every partition's snapshots of rounds after ``resumed_after`` (written by the
    killed run after its last checkpoint), so no later resume can read them."""
    for partition in Path(run_directory).glob("partition-*"):
        for r, path in snapshot_rounds(partition).items():
            if r > resumed_after:
                path.unlink(missing_ok=True)


def remove_run_snapshots(run_directory: Path) -> None:
    """Remove a run's snapshots once nothing can resume it (and their folder, if now empty)."""
    shutil.rmtree(run_directory, ignore_errors=True)
    try:
        Path(run_directory).parent.rmdir()
    except OSError:  # other runs' snapshots are still there
        pass
