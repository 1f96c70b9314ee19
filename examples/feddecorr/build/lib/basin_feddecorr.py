"""FedDecorr as a Basin plug-in: the whole method in one module.

Shi, Liang, Zhang, Tan, Bai, "Towards Understanding and Mitigating Dimensional Collapse
in Heterogeneous Federated Learning", ICLR 2023, eq. 5, as the authors' code computes it
(github.com/bytedance/FedDecorr, ``FedDecorrLoss``): each client minimises

    CE(F(x), y) + β · L_decorr(z),    L_decorr(z) = mean_{i ≠ j} (Ẑᵀ Ẑ)_{ij}² / N

where z (N × d) is the batch's representation (the classifier's input), Ẑ is z standardised
per dimension over the batch (mean 0, unbiased variance 1, ε = 1e-8 under the root) and
the mean runs over the d(d − 1) off-diagonal entries; β = ``feddecorr-beta`` (0.1, the
authors' default). The server is FedAvg sending β each round; like every method, it
composes with Basin's averaging rules (``--set averaging=ima``).

Installed with its entry point (pyproject.toml: ``[project.entry-points."basin.methods"]``,
``feddecorr = "basin_feddecorr"``), Basin finds it: ``--set strategy=feddecorr``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from clients.declarations import objective_method
from clients.options import Option
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


METHODS = (
    objective_method(
        "feddecorr", "FedDecorr", feddecorr_objective, ("feddecorr-beta",),
        options={"feddecorr-beta": Option(float, "a number >= 0 (FedDecorr's weight β of the decorrelation term)",
                                          lambda v: v >= 0, default=0.1)},
        model_needs="image", smoke_runs={"feddecorr": {"num-rounds": 2}},
    ),
)
