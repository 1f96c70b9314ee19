"""FedAlign's declaration (Mendieta et al., "Local Learning Matters: Rethinking Data
Heterogeneity in Federated Learning", CVPR 2022, eqs. 5–7): FedAvg whose clients add the
Lipschitz-alignment term of a slim sub-network (clients/objectives/fedalign.py).
"""

from __future__ import annotations

from clients.options import Option
from strategies.methods import ImplementedIn, TableRow, objective_method

METHODS = (
    objective_method(
        "fedalign", "FedAlign", ImplementedIn("clients.objectives.fedalign:fedalign_objective"),
        ("fedalign-mu", "fedalign-width"),
        # FedAlign clips its own gradients (the authors' methods/fedalign.py), not its baselines'.
        grad_clip=lambda config: config["fedalign-grad-clip"],
        options={
            "fedalign-mu": Option(float, "a number >= 0 (FedAlign's μ)", lambda v: v >= 0, default=0.45),
            "fedalign-width": Option(float, "a number in (0, 1) (FedAlign's slim width ω_S)", lambda v: 0 < v < 1,
                                     default=0.25),
            "fedalign-grad-clip": Option(float,
                "a number >= 0 (FedAlign's own gradient-norm clip, the authors' methods/fedalign.py; used by strategy"
                " = fedalign instead of grad-clip; 0 = none)", lambda v: v >= 0, default=10.0),
        },
        model_needs="slimmable-residual", cost_table={"fedalign": {}},
        # As its authors ran it: BatchNorm ResNet-56, Nesterov, crop + flip, under WIMA; crop +
        # flip needs images of 24 px or more, so on the suite's miniature CIFAR-100 hub set.
        smoke_runs={"fedalign+wima": {"averaging": "wima", "window": 2, "lr": 0.05, "dataset": "hf:{cifar100}",
                                      "model": "resnet56-bn", "nesterov": True, "augment": "crop-flip"}},
        table_row=TableRow('FedAlign (Mendieta et al., CVPR 2022) eq. 5–7: CE + μ·(CE/L_Lip)·L_Lip with the '
                           'factor carrying no gradient, σ_F from detached full-width features, μ = '
                           '`fedalign-mu`, ω_S = `fedalign-width`; gradient-norm clip `fedalign-grad-clip` (10), '
                           "FedAlign's own, sent in place of `grad-clip`",
                           "as the authors' code (ResNets only)"),
    ),
)
