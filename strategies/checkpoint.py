"""Checkpoints: what a run needs to continue after it was killed, exactly as if it had not been.

Every ``checkpoint-every`` rounds (and after the last) the ServerApp writes
``output-dir/checkpoint.pt`` atomically: the global model, the strategy's state (the
averaging window or running mean, server momentum, Adam moments, control variates), the
round counter, the random-number generators' states and the result rows so far. A run
started again with the same config and output directory continues from it.

Saved with ``torch.save`` as tensors and plain values only, so checkpoints load with
``torch.load(weights_only=True)``; numpy arrays round-trip through tensors exactly.
A checkpoint that cannot be read, or that another config wrote, is refused with a
:class:`CheckpointError` that says what to do.

What lives on the clients (SCAFFOLD's and FedMoSWA's c_i, FedDyn's gradient, MOON's
previous model, kept in each ClientApp's ``context.state``) is saved by the clients
themselves, one snapshot per round they train in (clients/state_store.py); the checkpoint
keeps the token that names this run's snapshots, and a resumed run hands every client
the snapshot of the checkpoint's round.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord

from strategies.arrays import to_arrays, to_numpy
from strategies.round_interface import RoundStrategy

CHECKPOINT_FILE = "checkpoint.pt"
CHECKPOINT_FORMAT = 2
CHECKPOINT_ENTRIES = {"format", "config", "round", "arrays", "strategy", "rng", "rows", "client-state-run"}
# Run-config keys that do not change a run's numbers: resuming may change them.
RESUMABLE_CHANGES = (
    "output-dir", "checkpoint-every", "resume", "round-timeout", "node-timeout",
    "save-models-every", "save-models-last", "save-client-models", "track", "track-dir", "track-group",
)
# torch (also through clients.state_store) is imported by the functions that use it: the
# launcher checks a run's checkpoint with read_checkpoint before Flower starts, and where
# there is none it needs no torch (~2 s on 2 CPU cores).


def _encode(value: Any) -> Any:
    import torch

    if isinstance(value, ArrayRecord):
        return {"__arrayrecord__": _encode(to_numpy(value))}
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, dict):
        if "__arrayrecord__" in value:
            return to_arrays(_decode(value["__arrayrecord__"]))
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def strategy_state(strategy: RoundStrategy) -> dict[str, Any]:
    """The state a strategy (possibly wrapped by ModelAveraging) carries across rounds."""
    return strategy.checkpoint_state()


def load_strategy_state(strategy: RoundStrategy, state: dict[str, Any]) -> None:
    strategy.load_checkpoint_state(state)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read, or belongs to another run."""


def run_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config entries a resumed run must share with the run that wrote the checkpoint."""
    return {key: value for key, value in config.items() if key not in RESUMABLE_CHANGES}


def rng_states() -> dict[str, Any]:
    """The server process's generators (Python, NumPy's global, torch CPU)."""
    import torch

    version, python_state, gauss = random.getstate()
    name, keys, position, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(python_state), gauss],
        "numpy": [name, keys, position, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }


def restore_rng_states(states: Mapping[str, Any]) -> None:
    import torch

    version, python_state, gauss = states["python"]
    random.setstate((version, tuple(python_state), gauss))
    np.random.set_state(tuple(states["numpy"]))
    torch.set_rng_state(torch.as_tensor(states["torch"], dtype=torch.uint8))


def read_checkpoint(directory: Path, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The checkpoint to resume ``config`` from: None when there is none (or resume is off).

    Raises :class:`CheckpointError` when the file is corrupt, of another format, or was
    written by a run with a different config.
    """
    path = Path(directory) / CHECKPOINT_FILE
    if not config["resume"] or not path.exists():
        return None
    advice = "delete it, or set resume = false to start this run over"
    try:
        payload = load_checkpoint(path)
    except Exception as error:  # torch's unpickler raises many types on a damaged file
        reason = str(error).splitlines()[0] if str(error) else ""
        raise CheckpointError(
            f"cannot resume from {path}: it is corrupt or not a Basin checkpoint ({type(error).__name__}: {reason}); {advice}"
        ) from error
    missing = sorted(CHECKPOINT_ENTRIES - set(payload)) if isinstance(payload, dict) else sorted(CHECKPOINT_ENTRIES)
    if missing:
        raise CheckpointError(f"cannot resume from {path}: it lacks {', '.join(missing)}; {advice}")
    if payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"cannot resume from {path}: format {payload.get('format')!r}, expected {CHECKPOINT_FORMAT}; {advice}")
    expected, written_by, server_round = run_identity(config), payload["config"], int(payload["round"])
    differing = sorted(key for key in set(expected) | set(written_by) if written_by.get(key) != expected.get(key))
    if differing:
        shown = ", ".join(f"{key} = {written_by.get(key)!r} there but {expected.get(key)!r} here" for key in differing[:5])
        raise CheckpointError(
            f"cannot resume from {path}: it was written by a run with another config ({shown}); "
            f"use another output-dir, or {advice}"
        )
    if not 1 <= server_round <= config["num-rounds"]:
        raise CheckpointError(f"cannot resume from {path}: round {server_round} is outside 1..{config['num-rounds']}; {advice}")
    return payload


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    from clients.state_store import atomic_save

    atomic_save(_encode(payload), path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    import torch

    return _decode(torch.load(path, weights_only=True))


def write_checkpoint(
    directory: Path, config: Mapping[str, Any], server_round: int, arrays: ArrayRecord, strategy,
    rows: list[dict[str, Any]], client_state_run: str, partition_names: list[str] | None = None,
) -> None:
    """Write ``directory/checkpoint.pt``: everything needed to continue after ``server_round``
    (``client_state_run`` names the clients' state snapshots of this run; ``partition_names``,
    a federation of named nodes' order: strategies/discovery.py)."""
    save_checkpoint(Path(directory) / CHECKPOINT_FILE, {
        "format": CHECKPOINT_FORMAT,
        "config": run_identity(config),
        "round": server_round,
        "arrays": arrays,
        "strategy": strategy_state(strategy),
        "rng": rng_states(),
        "rows": list(rows),
        "client-state-run": client_state_run,
        "partition-names": partition_names,
    })


def restore_checkpoint(payload: Mapping[str, Any], strategy) -> tuple[ArrayRecord, int]:
    """Load a checkpoint's strategy and generator states; return the global model and the
    first round still to run."""
    load_strategy_state(strategy, payload["strategy"])
    restore_rng_states(payload["rng"])
    return payload["arrays"], int(payload["round"]) + 1
