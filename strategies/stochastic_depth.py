"""Stochastic Depth's declaration (Huang et al., "Deep Networks with Stochastic Depth",
ECCV 2016; one of the FedAlign study's regularizers): FedAvg whose clients drop residual
blocks (clients/objectives/stochastic_depth.py).
"""

from __future__ import annotations

from clients.options import Option
from strategies.methods import ImplementedIn, TableRow, objective_method

METHODS = (
    objective_method(
        "stochastic-depth", "Stochastic Depth",
        ImplementedIn("clients.objectives.stochastic_depth:stochastic_depth_objective"), ("stochdepth-survival",),
        options={"stochdepth-survival": Option(float, "a number in (0, 1] (survival probability of the last block)",
                                               lambda v: 0 < v <= 1, default=0.9)},
        model_needs="slimmable-residual",
        smoke_runs={"stochastic-depth": {"num-rounds": 2, "model": "resnet20-gn", "lr": 0.05}},
        table_row=TableRow("the FedAlign study's regularizer Stochastic Depth (Huang et al., ECCV 2016): residual"
                           ' blocks dropped, survival probability decaying linearly to `stochdepth-survival` at '
                           'the last block',
                           '—'),
    ),
)
