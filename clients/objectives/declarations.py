"""The declarations of the methods that only change the clients' objective.

Each objective is implemented in its own module beside this one, whose docstring cites
its paper and equations: MOON (moon.py), FedSAM and FedASAM (sam.py), FedAlign
(fedalign.py), and the FedAlign study's regularizers Mixup (mixup.py), Stochastic Depth
(stochastic_depth.py) and GradAug (gradaug.py), and label smoothing (label_smoothing.py,
the worked example of docs/extending.md). A declaration names its objective's builder
where it is defined (:class:`~clients.declarations.ImplementedIn`), so this module, which
the launcher reads to validate a run, imports no torch; the registry
(strategies/methods.py) gives each method its server, FedAvg sending the objective.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clients.declarations import ImplementedIn, objective_method
from clients.model_names import resolve_model_name
from clients.options import Option

# Models the SAM papers call CNNs (their larger ASAM radius applies to them).
SAM_CNN_MODELS = ("mlp", "fmnist-cnn", "cifar-cnn")
SAM_RHO = Option(float,
        "a number >= 0 (SAM/ASAM radius ρ; 0 = the method's default: FedSAM 0.05, MoFedSAM and FedLESAM 0.1, "
        "FedASAM 0.7 on CNNs else 0.2)", lambda v: v >= 0, default=0.0)
ASAM_ETA = Option(float, "a number >= 0 (ASAM's η; 0 = the method's default)", lambda v: v >= 0, default=0.0)


def sam_settings(config: Mapping[str, Any]) -> dict[str, float]:
    """ρ and η with their defaults resolved: FedASAM ρ = 0.7, η = 0.2 on CNNs, else ρ = 0.2,
    η = 0.05; FedSAM ρ = 0.05."""
    cnn = resolve_model_name(config["model"], config["dataset"]) in SAM_CNN_MODELS
    default_rho = (0.7 if cnn else 0.2) if config["strategy"] == "fedasam" else 0.05
    settings = {"sam-rho": config["sam-rho"] or default_rho}
    if config["strategy"] == "fedasam":
        settings["asam-eta"] = config["asam-eta"] or (0.2 if cnn else 0.05)
    return settings


METHODS = (
    objective_method(
        "moon", "MOON", ImplementedIn("clients.objectives.moon:moon_objective"), ("moon-mu", "moon-temperature"),
        options={
            "moon-mu": Option(float, "a number >= 0 (MOON's contrastive weight μ)", lambda v: v >= 0, default=1.0),
            "moon-temperature": Option(float, "a number > 0 (MOON's τ)", lambda v: v > 0, default=0.5),
        },
        client_state=True, model_needs="image", projection_head=True, cost_table={"moon": {}},
    ),
    objective_method(
        "fedsam", "FedSAM", ImplementedIn("clients.objectives.sam:fedsam_objective"), ("sam-rho",),
        settings=sam_settings, options={"sam-rho": SAM_RHO}, cost_table={"fedsam": {}},
    ),
    objective_method(
        "fedasam", "FedASAM", ImplementedIn("clients.objectives.sam:fedasam_objective"), ("sam-rho", "asam-eta"),
        settings=sam_settings, options={"sam-rho": SAM_RHO, "asam-eta": ASAM_ETA},
    ),
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
    ),
    objective_method(
        "mixup", "Mixup", ImplementedIn("clients.objectives.mixup:mixup_objective"), ("mixup-gamma",),
        options={"mixup-gamma": Option(float, "a number > 0 (Mixup's Beta(γ, γ))", lambda v: v > 0, default=0.1)},
        model_needs="image",
    ),
    objective_method(
        "stochastic-depth", "Stochastic Depth",
        ImplementedIn("clients.objectives.stochastic_depth:stochastic_depth_objective"), ("stochdepth-survival",),
        options={"stochdepth-survival": Option(float, "a number in (0, 1] (survival probability of the last block)",
                                               lambda v: 0 < v <= 1, default=0.9)},
        model_needs="slimmable-residual",
    ),
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
    ),
    objective_method(
        "label-smoothing", "FedAvg+LS", ImplementedIn("clients.objectives.label_smoothing:label_smoothing_objective"),
        ("label-smoothing",),
        options={"label-smoothing": Option(float, "a number in [0, 1) (label smoothing's ε)", lambda v: 0 <= v < 1,
                                           default=0.1)},
    ),
)
