"""FedLC's objective: cross-entropy of the logits calibrated by the client's label counts.

    L = CE(f(x) − τ·n^{−1/4}, y),   n = the client's label counts (ClientInfo.label_counts)

the offsets broadcast over the class axis: of a sequence model's (N, C, T) logits too, each
position calibrated by the client's counts of scored targets.

A class the client does not hold (n = 0) gets −∞: it is never the target of one of the
client's examples and takes no probability mass, as FL-bench's and the NIID-Bench code's
``exp(logit − τ·n^{−1/4})`` give it none.

The calibration is a tensor of ``round_state``: a captured step (CUDA graphs) reads it from
the same memory every round, and each round's client copies its own values in (``adopt``),
so one client's counts are never replayed for another.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from clients.client_info import ClientInfo
from clients.training import LocalObjective


def calibration(label_counts: torch.Tensor, tau: float) -> torch.Tensor:
    """τ·n^{−1/4} per class; where n = 0, +∞ (0 with τ = 0: plain cross-entropy)."""
    counts = label_counts.to(torch.float32)
    absent = torch.full_like(counts, float("inf") if tau > 0 else 0.0)
    return torch.where(counts > 0, tau * counts.clamp(min=1).pow(-0.25), absent)


class LogitCalibration(LocalObjective):
    """Cross-entropy of f(x) − τ·n^{−1/4}, n this client's label counts."""

    capturable = True  # one forward and backward of static shapes; the counts are round state
    round_state = ("offsets",)

    def __init__(self, tau: float, device: torch.device):
        self.tau = tau
        self.device = device
        self.offsets = torch.empty(0, device=device)  # τ·n^{−1/4}, one per class: set by see_client

    def see_client(self, client: ClientInfo) -> None:
        self.offsets = calibration(client.label_count_tensor(), self.tau).to(self.device)

    def backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x)
        # Over the class axis, 1: (N, C) logits of images, (N, C, T) of a sequence model's positions.
        offsets = self.offsets.reshape(-1, *(1,) * (logits.dim() - 2))
        loss = F.cross_entropy(logits - offsets, y)
        loss.backward()
        return loss.detach()


def fedlc_objective(settings, model: nn.Module, state, rng, records) -> LogitCalibration:
    """FedLC with the round's τ, on the model's device."""
    return LogitCalibration(float(settings["fedlc-tau"]), next(model.parameters()).device)
