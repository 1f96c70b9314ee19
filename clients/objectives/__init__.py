"""Local objectives by name: what a client minimises on each batch.

The server's strategy names the objective and its settings in the round config
(``objective`` plus the method's keys, see strategies/client_objective.py); the client
builds it here each round.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import RecordDict
from torch import nn

from clients.mime import MimeObjective
from clients.objectives.fedalign import FedAlign
from clients.objectives.fedfa import FeatureAnchors
from clients.objectives.fedlesam import LocallyEstimatedSam
from clients.objectives.gradaug import GradAug
from clients.objectives.mixup import Mixup
from clients.objectives.moon import Moon
from clients.objectives.sam import SharpnessAware
from clients.objectives.stochastic_depth import StochasticDepth
from clients.protocol import FEDFA_ANCHOR_LOSS, FEDFA_ANCHORS, FEDFA_CALIBRATE, FEDLESAM_UPDATE, MIME_CORRECTION
from clients.training import LocalObjective

# Objective name → the round-config keys of its settings.
OBJECTIVE_SETTINGS: dict[str, tuple[str, ...]] = {
    "cross-entropy": (),
    "moon": ("moon-mu", "moon-temperature"),
    "fedsam": ("sam-rho",),
    "fedasam": ("sam-rho", "asam-eta"),
    "mofedsam": ("sam-rho",),
    "fedlesam": ("sam-rho",),
    "mime": (),
    "fedfa": ("fedfa-lambda", "fedfa-rho"),
    "fedalign": ("fedalign-mu", "fedalign-width"),
    "mixup": ("mixup-gamma",),
    "stochastic-depth": ("stochdepth-survival",),
    "gradaug": ("gradaug-subnets", "gradaug-min-width", "gradaug-mu"),
}


def build_objective(
    name: str, settings: Mapping[str, Any], model: nn.Module, state: RecordDict, rng: np.random.Generator,
    records: Mapping[str, Any] | None = None,
) -> LocalObjective:
    """The objective ``name`` for one round; ``state`` is the client's ``context.state``,
    ``records`` the training message's content (the tensors a server sent besides the model)."""
    if name == "cross-entropy":
        return LocalObjective()
    if name == "moon":
        return Moon(model, state, float(settings["moon-mu"]), float(settings["moon-temperature"]))
    if name == "fedsam":
        return SharpnessAware(float(settings["sam-rho"]))
    if name == "mofedsam":  # ESAM's norm guard (strategies/mofedsam.py)
        return SharpnessAware(float(settings["sam-rho"]), norm_guard=1e-7)
    if name == "fedfa":  # the anchors come beside the model; the IMA schedule switches parts per round
        return FeatureAnchors(
            model, records[FEDFA_ANCHORS].to_torch_state_dict()["anchors"], float(settings["fedfa-lambda"]),
            float(settings["fedfa-rho"]),
            anchor_loss=bool(settings[FEDFA_ANCHOR_LOSS]), calibrate=bool(settings[FEDFA_CALIBRATE]),
        )
    if name == "mime":  # MIME's corrected gradient needs c, sent beside the model
        return MimeObjective(model, records[MIME_CORRECTION].to_torch_state_dict())
    if name == "fedlesam":
        update = records[FEDLESAM_UPDATE] if records is not None and FEDLESAM_UPDATE in records else None
        return LocallyEstimatedSam(model, state, float(settings["sam-rho"]),
                                   None if update is None else update.to_torch_state_dict())
    if name == "fedasam":
        return SharpnessAware(float(settings["sam-rho"]), adaptive=True, eta=float(settings["asam-eta"]))
    if name == "fedalign":
        return FedAlign(float(settings["fedalign-mu"]), float(settings["fedalign-width"]))
    if name == "mixup":
        return Mixup(float(settings["mixup-gamma"]), rng)
    if name == "stochastic-depth":
        return StochasticDepth(model, float(settings["stochdepth-survival"]))
    if name == "gradaug":
        return GradAug(
            int(settings["gradaug-subnets"]), float(settings["gradaug-min-width"]), float(settings["gradaug-mu"]), rng
        )
    raise ValueError(f"unknown local objective {name!r}; allowed: {', '.join(OBJECTIVE_SETTINGS)}")
