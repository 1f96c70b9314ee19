"""Stochastic Depth (Huang et al., ECCV 2016), a local regularizer of the FedAlign study.

During local training the residual branch of block l (l = 0 … L − 1) is dropped for the
whole batch with probability 1 − p_l, p_l = 1 − (l/(L − 1))(1 − p_L): a linear decay from
p = 1 at the first block to p_L = 0.9 at the last, as the FedAlign authors' code
(``models/resnet_stochdepth.py``: ``prob_step = (1 − p_L)/(ΣL − 1)``) runs the study's
baseline. (Huang et al. count the input as block 0, so their first residual block already
has p = 1 − (1 − p_L)/L: one block off from the code, which this follows.) Via
``torchvision.ops.stochastic_depth``. That op rescales kept branches by 1/p_l in
training, so the evaluated model needs no change (the paper instead scales by p_l at test
time; the expectation is the same).

The drops are drawn for the whole round before its first step (:meth:`StochasticDepth.draws`),
as the op draws them — one Bernoulli(p_l) per block with a drop rate > 0, in block
order, from torch's global generator (seeded per client round), divided by p_l — and each
step hands its blocks their factors (``branch_scale``), so the step is captured as a
CUDA graph. The factors are removed after the round.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from clients.models.slimmable import StagedNet
from clients.training import LocalObjective


def drop_rates(num_blocks: int, final_survival: float) -> list[float]:
    """1 − p_l for l = 0 … L − 1 with p_l = 1 − (l/(L − 1))(1 − p_L) (one block: p_L)."""
    if num_blocks == 1:
        return [1 - final_survival]
    return [(block / (num_blocks - 1)) * (1 - final_survival) for block in range(num_blocks)]


class StochasticDepth(LocalObjective):
    capturable = True  # the drops are the step's inputs

    def __init__(self, model: nn.Module, final_survival: float = 0.9):
        if not isinstance(model, StagedNet):
            raise TypeError(f"Stochastic Depth needs a residual network, got {type(model).__name__}")
        self.final_survival = final_survival
        blocks = model.residual_blocks()
        self.rates = drop_rates(len(blocks), final_survival)
        # torchvision's stochastic_depth draws nothing for a rate of 0 (the first block): neither does this.
        self.dropping = [(block, rate) for block, rate in zip(blocks, self.rates) if rate > 0.0]

    def signature(self) -> tuple:
        return (self.final_survival,)

    def draws(self, batch_sizes: Sequence[int]) -> list[tuple[torch.Tensor, ...]]:
        """Per step, one factor per dropping block: Bernoulli(1 − rate)/(1 − rate), shape (1, 1, 1, 1)."""
        if not self.dropping:
            return [()] * len(batch_sizes)
        drawn = []
        for _ in batch_sizes:
            factors = []
            for _, rate in self.dropping:
                survival = 1.0 - rate
                noise = torch.empty([1, 1, 1, 1]).bernoulli_(survival)
                factors.append(noise.div_(survival) if survival > 0.0 else noise)
            drawn.append((torch.cat(factors),))
        return drawn

    def backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *factors: torch.Tensor) -> torch.Tensor:
        for (block, _), factor in zip(self.dropping, factors[0] if factors else ()):
            block.branch_scale = factor[None]
        return super().backward(model, x, y)

    def finish(self, model: nn.Module) -> None:
        for block, _ in self.dropping:
            block.branch_scale = None


def stochastic_depth_objective(settings, model: nn.Module, state, rng, records) -> StochasticDepth:
    """Stochastic Depth with the round's p_L (the declaration: strategies/stochastic_depth.py)."""
    return StochasticDepth(model, float(settings["stochdepth-survival"]))
