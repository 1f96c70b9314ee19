"""FedCM, client side (Xu et al., arXiv 2106.10874; FL-Simulator client/fedcm.py L19–33,
GHBM fedcm_client.py L33–37; strategies/fedcm.py has the server and the sources).

Every local step mixes the server's direction into the gradient before clipping:
v = α·g + (1 − α)·Δ_t, then SGD clips v and adds weight decay as usual. Δ_t is the
server's D divided by this client's η_l·K_i (``fedcm-scale = client``, the default) or D
itself (``none``: the server scaled it). FedCM keeps no client state.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from flwr.app import RecordDict
from torch import nn

from clients import protocol
from clients.client_step import GradientTerm
from clients.components import ClientComponent
from clients.training import LocalTrainingConfig


@torch.no_grad()
def mix_direction(params: list[nn.Parameter], directions: list[torch.Tensor], alpha: float) -> None:
    """g ← α·g + (1 − α)·Δ_t."""
    for param, direction in zip(params, directions):
        param.grad.mul_(alpha).add_(direction, alpha=1.0 - alpha)


def fedcm_term(model: nn.Module, direction: Mapping[str, torch.Tensor], alpha: float, step_scale: float) -> GradientTerm:
    """The round's FedCM gradient term: Δ_t = ``step_scale``·D for each trained weight
    (``direction``: D by state-dict name, as received)."""
    device = next(model.parameters()).device
    directions = [direction[name].to(device) * step_scale for name, _ in model.named_parameters()]
    return GradientTerm(f"fedcm alpha={alpha!r}", lambda params, inputs: mix_direction(params, inputs, alpha), directions)


class MomentumDirection(ClientComponent):
    """FedCM/MoFedSAM: v = α·g + (1 − α)·Δ_t, Δ_t scaled by this client's K_i when per client."""

    def __init__(self, model: nn.Module, content: RecordDict):
        config = content["config"]
        self.model = model
        self.direction = content[protocol.FEDCM_DIRECTION].to_torch_state_dict()
        self.alpha = float(config[protocol.FEDCM_ALPHA])
        self.per_client = config[protocol.FEDCM_SCALE] == "client"

    def gradient_terms(self, config: LocalTrainingConfig, num_examples: int) -> list:
        # K_i as planned: under partial work (clients/system_speed.py) Δ_t is set before the cut
        step_scale = 1.0 / (config.lr * config.planned_steps(num_examples)) if self.per_client else 1.0
        return [fedcm_term(self.model, self.direction, self.alpha, step_scale)]


def momentum_direction(model: nn.Module, content: RecordDict, state: RecordDict) -> ClientComponent | None:
    return MomentumDirection(model, content) if protocol.FEDCM_DIRECTION in content else None
