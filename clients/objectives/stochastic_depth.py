"""Stochastic Depth (Huang et al., ECCV 2016), a local regularizer of the FedAlign study.

During local training the residual branch of block l (l = 0 … L − 1) is dropped for the
whole batch with probability 1 − p_l, p_l = 1 − (l/(L − 1))(1 − p_L): a linear decay from
p = 1 at the first block to p_L = 0.9 at the last, as the FedAlign authors' code
(``models/resnet_stochdepth.py``: ``prob_step = (1 − p_L)/(ΣL − 1)``) runs the study's
baseline. (Huang et al. count the input as block 0, so their first residual block already
has p = 1 − (1 − p_L)/L: one block off from the code, which this follows.) Via
``torchvision.ops.stochastic_depth``. That op rescales kept branches by 1/p_l in
training, so the evaluated model needs no change (the paper instead scales by p_l at test
time; the expectation is the same). Drop rates are reset after the round.
"""

from __future__ import annotations

from torch import nn

from clients.models.slimmable import StagedNet
from clients.training import LocalObjective


def drop_rates(num_blocks: int, final_survival: float) -> list[float]:
    """1 − p_l for l = 0 … L − 1 with p_l = 1 − (l/(L − 1))(1 − p_L) (one block: p_L)."""
    if num_blocks == 1:
        return [1 - final_survival]
    return [(block / (num_blocks - 1)) * (1 - final_survival) for block in range(num_blocks)]


class StochasticDepth(LocalObjective):
    def __init__(self, model: nn.Module, final_survival: float = 0.9):
        if not isinstance(model, StagedNet):
            raise TypeError(f"Stochastic Depth needs a residual network, got {type(model).__name__}")
        self.blocks = model.residual_blocks()
        for block, rate in zip(self.blocks, drop_rates(len(self.blocks), final_survival)):
            block.drop_rate = rate

    def finish(self, model: nn.Module) -> None:
        for block in self.blocks:
            block.drop_rate = 0.0


def stochastic_depth_objective(settings, model: nn.Module, state, rng, records) -> StochasticDepth:
    """Stochastic Depth with the round's p_L (the declaration: clients/objectives/declarations.py)."""
    return StochasticDepth(model, float(settings["stochdepth-survival"]))
