"""FedLESAM, client side (Fan, Hu, Wang, Wang, Huang, Li, Gong, Liu, "Locally Estimated Global
Perturbations are Better than Local Perturbations for Federated Sharpness-aware
Minimization", ICML 2024, arXiv 2405.18890; strategies/fedlesam.py has the server and sources).

SAM's ascent direction estimated from the global models instead of the local gradient: once
per round ε = ρ·(θ^{τ_i} − θ^t)/‖θ^{τ_i} − θ^t‖₂ (global L2 norm over the trained weights),
where θ^t is the model received now and θ^{τ_i} the one this client received when it last
trained (kept in ``context.state``); each step takes g = ∇ℓ(y + ε) on the batch, removes ε
again, and SGD clips g and adds weight decay as usual: one backward pass per step. On a
client's first participation there is no θ^{τ_i}: plain SGD (ε = 0), as the authors' code in
its first round. The ``official-code`` variant passes θ^{τ_i} = θ^t − u with u the last global
update the server sends (ε = −ρ·u/‖u‖), and keeps no client state.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn
from torch.nn import functional as F

from clients.protocol import FEDLESAM_PREVIOUS_GLOBAL, FEDLESAM_UPDATE
from clients.training import LocalObjective


class LocallyEstimatedSam(LocalObjective):
    """Cross-entropy's gradient at y + ε, with ε fixed for the round (see the module docstring)."""

    capturable = True  # ε is computed once per round, before the steps; a step only adds and removes it
    round_state = ("epsilon",)

    def __init__(self, model: nn.Module, state: RecordDict, rho: float, update: dict[str, torch.Tensor] | None = None):
        self.state = state
        self.keeps_state = update is None  # the paper's form: θ^{τ_i} lives in the client state
        self.received = {name: p.detach().clone() for name, p in model.named_parameters()}
        if update is not None:
            previous = {name: value - update[name].to(value.device) for name, value in self.received.items()}
        elif FEDLESAM_PREVIOUS_GLOBAL in state:
            stored = state[FEDLESAM_PREVIOUS_GLOBAL].to_torch_state_dict()
            previous = {name: stored[name].to(value.device) for name, value in self.received.items()}
        else:
            previous = None
        self.epsilon = None if previous is None else ascent(self.received, previous, rho)

    def signature(self) -> tuple:
        # A first participation trains plain SGD: a step of its own, not one adding ε = 0.
        return (self.epsilon is not None,)

    def backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        params = list(model.parameters())
        if self.epsilon is not None:
            with torch.no_grad():
                torch._foreach_add_(params, self.epsilon)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if self.epsilon is not None:
            with torch.no_grad():
                torch._foreach_sub_(params, self.epsilon)
        return loss.detach()

    def finish(self, model: nn.Module) -> None:
        """θ^{τ_i} ← θ^t for the client's next round (the paper's form)."""
        if self.keeps_state:
            self.state[FEDLESAM_PREVIOUS_GLOBAL] = ArrayRecord({k: v.cpu() for k, v in self.received.items()})


def ascent(received: dict[str, torch.Tensor], previous: dict[str, torch.Tensor], rho: float) -> list[torch.Tensor]:
    """ε = ρ·(θ^{τ_i} − θ^t)/‖θ^{τ_i} − θ^t‖₂ per weight tensor (0 when the two are equal)."""
    differences = [previous[name] - value for name, value in received.items()]
    norm = torch.sqrt(sum((d.double() ** 2).sum() for d in differences))
    if norm == 0:
        return [torch.zeros_like(d) for d in differences]
    return [(rho * d / norm).to(d.dtype) for d in differences]


def fedlesam_objective(settings, model: nn.Module, state: RecordDict, rng, records) -> LocallyEstimatedSam:
    """FedLESAM's step; the official-code variant's u comes beside the model."""
    update = records[FEDLESAM_UPDATE] if records is not None and FEDLESAM_UPDATE in records else None
    return LocallyEstimatedSam(model, state, float(settings["sam-rho"]), None if update is None else update.to_torch_state_dict())
