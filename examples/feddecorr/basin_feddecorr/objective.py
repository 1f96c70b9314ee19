"""FedDecorr's objective: cross-entropy plus β times the decorrelation of the batch's
representation (the method and its equation: basin_feddecorr/__init__.py)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from clients.training import LocalObjective

EPSILON = 1e-8


def decorrelation_loss(z: torch.Tensor) -> torch.Tensor:
    """mean_{i ≠ j} (ẐᵀẐ)_{ij}² / N for the batch representation z (N × d), Ẑ standardised per dimension."""
    n, d = z.shape
    if n == 1:  # a batch of one has no spread to standardise
        return z.sum() * 0.0
    standardised = (z - z.mean(dim=0, keepdim=True)) / torch.sqrt(EPSILON + z.var(dim=0, keepdim=True))
    correlation = standardised.T @ standardised
    off_diagonal = correlation[~torch.eye(d, dtype=torch.bool, device=z.device)]
    return off_diagonal.pow(2).mean() / n


class FedDecorr(LocalObjective):
    """Cross-entropy plus β times the decorrelation of the batch's representation."""

    capturable = True  # two matrix products of static shapes, no host synchronisation

    def __init__(self, beta: float):
        self.beta = beta

    def signature(self) -> tuple:
        return (self.beta,)

    def backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = model.represent(x)
        loss = F.cross_entropy(model.classifier(z), y) + self.beta * decorrelation_loss(z)
        loss.backward()
        return loss.detach()


def feddecorr_objective(settings, model: nn.Module, state, rng, records) -> FedDecorr:
    """FedDecorr with the round's β."""
    return FedDecorr(float(settings["feddecorr-beta"]))

