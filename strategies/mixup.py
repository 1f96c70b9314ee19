"""Mixup's declaration (Zhang et al., "mixup: Beyond Empirical Risk Minimization", ICLR
2018; one of the FedAlign study's regularizers): FedAvg whose clients train on mixed
batches (clients/objectives/mixup.py).
"""

from __future__ import annotations

from clients.options import Option
from strategies.methods import ImplementedIn, TableRow, objective_method

METHODS = (
    objective_method(
        "mixup", "Mixup", ImplementedIn("clients.objectives.mixup:mixup_objective"), ("mixup-gamma",),
        options={"mixup-gamma": Option(float, "a number > 0 (Mixup's Beta(γ, γ))", lambda v: v > 0, default=0.1)},
        model_needs="image",
        smoke_runs={"mixup": {"num-rounds": 2, "lr": 0.05}},  # its code needs images, not a ResNet: the digits CNN
        table_row=TableRow("the FedAlign study's regularizer Mixup (Zhang et al., ICLR 2018): each batch mixed "
                           'with its permutation, λ ~ Beta(γ, γ), γ = `mixup-gamma`',
                           '—'),
    ),
)
