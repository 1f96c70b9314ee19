"""GradAug's declaration (Yang, Yang, Shao, Ye, "GradAug: A New Regularization Method for
Deep Neural Networks", NeurIPS 2020; one of the FedAlign study's regularizers): FedAvg
whose clients distil into random-width sub-networks (clients/objectives/gradaug.py).
"""

from __future__ import annotations

from clients.options import Option
from strategies.methods import ImplementedIn, TableRow, objective_method

METHODS = (
    objective_method(
        "gradaug", "GradAug", ImplementedIn("clients.objectives.gradaug:gradaug_objective"),
        ("gradaug-subnets", "gradaug-min-width", "gradaug-mu"),
        options={
            "gradaug-subnets": Option(int, "an integer >= 1 (GradAug's n)", lambda v: v >= 1, default=2),
            "gradaug-min-width": Option(float, "a number in (0, 1] (GradAug's ω_b)", lambda v: 0 < v <= 1, default=0.8),
            "gradaug-mu": Option(float, "a number >= 0 (GradAug's distillation weight μ)", lambda v: v >= 0,
                                 default=1.75),
        },
        model_needs="slimmable-residual", cost_table={"gradaug-n1": {"gradaug-subnets": 1}, "gradaug-n2": {"gradaug-subnets": 2}},
        smoke_runs={"gradaug": {"num-rounds": 2, "model": "resnet20-gn", "lr": 0.05}},
        table_row=TableRow("the FedAlign study's regularizer GradAug (Yang et al., NeurIPS 2020): n = "
                           '`gradaug-subnets` sub-networks, the smallest width ω_b = `gradaug-min-width` always '
                           'one of them, KD μ = `gradaug-mu`',
                           "GradAug as the authors' code (sandwich widths)"),
    ),
)
