"""Mixup (Zhang et al., ICLR 2018), a local regularizer of the FedAlign study (METHODS.md §2.1).

Per batch: λ ~ Beta(γ, γ) (γ = 0.1), a random pairing π of the batch,
x̃ = λ·x + (1 − λ)·x_π, loss = λ·CE(F(x̃), y) + (1 − λ)·CE(F(x̃), y_π).
λ and π come from the client's seeded generator, so runs are reproducible.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from clients.training import LocalObjective


class Mixup(LocalObjective):
    def __init__(self, gamma: float, rng: np.random.Generator):
        self.gamma = gamma
        self.rng = rng

    def backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        lam = float(self.rng.beta(self.gamma, self.gamma))
        pairing = torch.from_numpy(self.rng.permutation(len(y))).to(x.device)
        logits = model(lam * x + (1 - lam) * x[pairing])
        loss = lam * F.cross_entropy(logits, y) + (1 - lam) * F.cross_entropy(logits, y[pairing])
        loss.backward()
        return loss.detach()


def mixup_objective(settings, model: nn.Module, state, rng: np.random.Generator, records) -> Mixup:
    """Mixup with the round's γ (the declaration: clients/objectives/declarations.py)."""
    return Mixup(float(settings["mixup-gamma"]), rng)
