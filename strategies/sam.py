"""FedSAM's and FedASAM's declarations (Qu et al., "Generalized Federated Learning via
Sharpness Aware Minimization", ICML 2022; Caldarola, Caputo, Ciccone, "Improving
Generalization in Federated Learning by Seeking Flat Minima", ECCV 2022): FedAvg whose
clients take SAM / adaptive SAM steps (clients/objectives/sam.py). ``sam-rho`` is shared
with MoFedSAM and FedLESAM, which import it from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clients.model_names import resolve_model_name
from clients.options import Option
from strategies.methods import ImplementedIn, TableRow, objective_method

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
        "fedsam", "FedSAM", ImplementedIn("clients.objectives.sam:fedsam_objective"), ("sam-rho",),
        settings=sam_settings, options={"sam-rho": SAM_RHO}, cost_table={"fedsam": {}},
        smoke_runs={"fedsam": {"num-rounds": 2}},
        table_row=TableRow('FedSAM (Qu et al. 2022) / FedASAM (Caldarola et al. 2022): SAM / adaptive SAM local '
                           'step, ρ = `sam-rho`, η = `asam-eta` (0: ρ = 0.7, η = 0.2 on CNNs, else 0.2, 0.05; '
                           'FedSAM 0.05)',
                           '—'),
    ),
    objective_method(
        "fedasam", "FedASAM", ImplementedIn("clients.objectives.sam:fedasam_objective"), ("sam-rho", "asam-eta"),
        settings=sam_settings, options={"sam-rho": SAM_RHO, "asam-eta": ASAM_ETA},
        smoke_runs={"fedasam": {"num-rounds": 2}},
    ),
)
