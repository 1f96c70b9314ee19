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
from torch import nn

from clients.client_step import GradientTerm


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
