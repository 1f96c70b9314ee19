"""Label smoothing as the local objective — the worked example of a client objective
(docs/extending.md).

Szegedy, Vanhoucke, Ioffe, Shlens, Wojna, "Rethinking the Inception Architecture for
Computer Vision", CVPR 2016, §7: the one-hot target of class y is replaced by

    q'(k) = (1 − ε)·[k = y] + ε/C            (C classes, ε = ``label-smoothing``)

and each client minimises the cross-entropy H(q', softmax(F(x))) on each batch — torch's
``cross_entropy(..., label_smoothing=ε)``. ε = 0 gives FedAvg's objective.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from clients.training import LocalObjective


class LabelSmoothing(LocalObjective):
    """Cross-entropy against targets smoothed by ε."""

    capturable = True  # a fixed function of the batch: CUDA graphs may replay it

    def __init__(self, epsilon: float):
        self.epsilon = epsilon

    def signature(self) -> tuple:
        return (self.epsilon,)

    def backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(model(x), y, label_smoothing=self.epsilon)
        loss.backward()
        return loss.detach()


def label_smoothing_objective(settings, model: nn.Module, state, rng, records) -> LabelSmoothing:
    """Label smoothing with the round's ε (the declaration: strategies/label_smoothing.py)."""
    return LabelSmoothing(float(settings["label-smoothing"]))
