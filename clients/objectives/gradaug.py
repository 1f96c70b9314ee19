"""GradAug (Yang, Ma, Zhou, Huang, NeurIPS 2020), a local regularizer of the FedAlign study.

Per batch: the full network is trained with CE on the labels; then n sub-networks — the
first ⌈ω·C⌉ channels of every layer, sharing the weights — each see the batch at a random
resolution and are trained to match the full network's (detached) soft predictions:
μ·KL(p_full ‖ p_sub), μ = 1.75 for n = 2. Gradients of the n + 1 passes accumulate
before the one SGD step.

Widths as in GradAug's and FedAlign's code (the "sandwich rule"): the smallest width
ω_b = 0.8 is always one of the n, the other n − 1 are drawn from U(ω_b, 1), and they run
from the widest to the narrowest. Resolutions: the input size scaled by one of 1, 0.875,
0.75, 0.625 (the authors' ``main.py`` CIFAR set {32, 28, 24, 20}), drawn per sub-network;
bilinear with ``align_corners=True`` as in the authors' code. Sub-network channel counts
are rounded as the authors' ``make_divisible`` rounds them: ω·C to the nearest multiple of
8, not more than 10 % below (a 16-channel layer at ω = 0.8 keeps all 16; Basin's own
rounding, used by FedAlign's slim pass, would keep 14).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from clients.models.slimmable import StagedNet, slimmable_width
from clients.training import LocalObjective

RESOLUTION_SCALES = (1.0, 0.875, 0.75, 0.625)  # 32, 28, 24, 20 of a 32-pixel image
CHANNEL_DIVISOR = 8  # the authors' make_divisible


class GradAug(LocalObjective):
    not_captured_because = (
        "each step draws its sub-networks' widths (from U(ω_b, 1)) and input resolutions (4 sizes), which change "
        "the shapes of the step's tensors; a graph per combination would be recaptured for most steps"
    )

    def __init__(self, num_subnets: int, min_width: float, mu: float, rng: np.random.Generator):
        self.num_subnets = num_subnets
        self.min_width = min_width
        self.mu = mu
        self.rng = rng

    def subnet_widths(self) -> list[float]:
        """ω_b and n − 1 draws from U(ω_b, 1), widest first."""
        drawn = [float(w) for w in self.rng.uniform(self.min_width, 1.0, self.num_subnets - 1)]
        return sorted([self.min_width, *drawn], reverse=True)

    def backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not isinstance(model, StagedNet):
            raise TypeError(f"GradAug needs a width-slimmable network, got {type(model).__name__}")
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        target = F.softmax(logits.detach(), dim=1)
        total = loss.detach()
        for width in self.subnet_widths():
            scale = RESOLUTION_SCALES[int(self.rng.integers(len(RESOLUTION_SCALES)))]
            size = [max(1, round(s * scale)) for s in x.shape[2:]]
            x_sub = x if scale == 1.0 else F.interpolate(x, size=size, mode="bilinear", align_corners=True)
            with slimmable_width(model, width, CHANNEL_DIVISOR):
                sub_logits = model(x_sub)
            distillation = self.mu * F.kl_div(F.log_softmax(sub_logits, dim=1), target, reduction="batchmean")
            distillation.backward()
            total = total + distillation.detach()
        return total


def gradaug_objective(settings, model: nn.Module, state, rng: np.random.Generator, records) -> GradAug:
    """GradAug with the round's n, ω_b and μ (the declaration: strategies/gradaug.py)."""
    return GradAug(int(settings["gradaug-subnets"]), float(settings["gradaug-min-width"]), float(settings["gradaug-mu"]),
                   rng)
