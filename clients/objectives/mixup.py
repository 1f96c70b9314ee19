"""Mixup (Zhang et al., ICLR 2018), a local regularizer of the FedAlign study (METHODS.md §2.1).

Per batch: λ ~ Beta(γ, γ) (γ = 0.1), a random pairing π of the batch,
x̃ = λ·x + (1 − λ)·x_π, loss = λ·CE(F(x̃), y) + (1 − λ)·CE(F(x̃), y_π).
λ and π come from the client's seeded generator, so runs are reproducible; they are drawn
for the whole round before its first step (:meth:`Mixup.draws`, in the order a step after
step would draw them) and reach each step as its inputs, so the step is captured as a
CUDA graph. λ and 1 − λ are each rounded to float32 once, as a Python float is when it
multiplies a float32 tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from clients.training import LocalObjective


class Mixup(LocalObjective):
    capturable = True  # λ and π are the step's inputs

    def __init__(self, gamma: float, rng: np.random.Generator):
        self.gamma = gamma
        self.rng = rng

    def signature(self) -> tuple:
        return (self.gamma,)

    def draws(self, batch_sizes: Sequence[int]) -> list[tuple[torch.Tensor, ...]]:
        """Per step: λ, 1 − λ (float32) and the pairing π (a permutation of the batch)."""
        drawn = []
        for size in batch_sizes:
            lam = float(self.rng.beta(self.gamma, self.gamma))
            pairing = torch.from_numpy(self.rng.permutation(size))
            drawn.append((torch.tensor(lam, dtype=torch.float32), torch.tensor(1 - lam, dtype=torch.float32), pairing))
        return drawn

    def backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, lam: torch.Tensor, rest: torch.Tensor,
                 pairing: torch.Tensor) -> torch.Tensor:
        logits = model(lam * x + rest * x[pairing])
        loss = lam * F.cross_entropy(logits, y) + rest * F.cross_entropy(logits, y[pairing])
        loss.backward()
        return loss.detach()


def mixup_objective(settings, model: nn.Module, state, rng: np.random.Generator, records) -> Mixup:
    """Mixup with the round's γ (the declaration: strategies/mixup.py)."""
    return Mixup(float(settings["mixup-gamma"]), rng)
