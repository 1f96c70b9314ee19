"""Saved models for the analysis tools (run-config ``save-models-every``, ``save-models-last``,
``save-client-models``).

With ``save-models-every`` = k > 0 the ServerApp writes ``output-dir/models/round-RRRR.pt``
after rounds k, 2k, …, after each of the last ``save-models-last`` rounds and after the
final one. Each file holds what the tools read (experiments/analysis/):

- ``base``: the base method's global model of the round (under IMA/WIMA/SWA the FMA model
  before the window average — FedIMA's ``global_model_beforeIMA``);
- ``averaged``: the window average, when the round has one (else absent);
- ``clients``: the round's accepted client models, at most ``save-client-models`` of them,
  the first in partition order (the cohort itself is a seeded random sample), keyed by
  partition id, with their sample counts in ``client-weights``.

Files are written atomically and load with ``torch.load(weights_only=True)``. They follow
the checkpoint rules: a run resumed after round c deletes the files of rounds after c
(they are written again as those rounds run again).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clients.state_store import atomic_save

MODELS_DIR = "models"
_ROUND_FILE = re.compile(r"round-(\d+)\.pt")


def saves_round(config: Mapping[str, Any], server_round: int) -> bool:
    """Whether round ``server_round`` writes a models file under ``config``."""
    every, last, rounds = config["save-models-every"], config["save-models-last"], config["num-rounds"]
    return every > 0 and (server_round % every == 0 or server_round > rounds - last or server_round == rounds)


def round_path(directory: Path, server_round: int) -> Path:
    return Path(directory) / MODELS_DIR / f"round-{server_round:04d}.pt"


def _tensors(state: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {key: torch.from_numpy(np.array(value, copy=True)) for key, value in state.items()}


def save_round_models(
    directory: Path, server_round: int, base: Mapping[str, np.ndarray], averaged: Mapping[str, np.ndarray] | None,
    clients: Mapping[int, Mapping[str, np.ndarray]], client_weights: Mapping[int, float],
) -> Path:
    """Write one round's models (see the module docstring); returns the file."""
    path = round_path(directory, server_round)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {
        "round": server_round,
        "base": _tensors(base),
        "clients": {str(pid): _tensors(state) for pid, state in clients.items()},
        "client-weights": {str(pid): float(client_weights[pid]) for pid in clients},
    }
    if averaged is not None:
        payload["averaged"] = _tensors(averaged)
    atomic_save(payload, path)
    return path


def saved_rounds(directory: Path) -> list[int]:
    """The rounds with a models file in ``directory`` (a run's output directory), sorted."""
    folder = Path(directory) / MODELS_DIR
    found = (_ROUND_FILE.fullmatch(p.name) for p in folder.glob("round-*.pt")) if folder.is_dir() else ()
    return sorted(int(match.group(1)) for match in found if match)


def load_round_models(directory: Path, server_round: int) -> dict[str, Any]:
    """One round's saved models: ``base``, ``averaged`` (or None), ``clients`` {partition id:
    state dict} in partition order and ``client-weights`` {partition id: n_k}."""
    path = round_path(directory, server_round)
    if not path.exists():
        available = ", ".join(map(str, saved_rounds(directory))) or "none"
        raise FileNotFoundError(
            f"{path} does not exist: no models were saved after round {server_round} (saved rounds: {available}); "
            "run with save-models-every > 0"
        )
    payload = torch.load(path, weights_only=True)
    order = sorted(payload["clients"], key=int)
    return {
        "round": int(payload["round"]),
        "base": payload["base"],
        "averaged": payload.get("averaged"),
        "clients": {int(pid): payload["clients"][pid] for pid in order},
        "client-weights": {int(pid): payload["client-weights"][pid] for pid in order},
    }


def discard_rounds_after(directory: Path, server_round: int) -> None:
    """Delete the models files of rounds after ``server_round`` (a resume runs them again)."""
    for saved in saved_rounds(directory):
        if saved > server_round:
            round_path(directory, saved).unlink(missing_ok=True)
