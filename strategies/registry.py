"""Strategies by name: validated run config → strategy instance and client schedule.

Methods never read the run config themselves; this is the one place that turns it into
constructor arguments, so every strategy is usable from a user's own ServerApp.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.serverapp.strategy import Strategy

from clients.models import resolve_model_name
from clients.objectives import OBJECTIVE_SETTINGS
from strategies.adabest import AdaBest
from strategies.averaging import ModelAveraging
from strategies.client_objective import ClientObjectiveFedAvg
from strategies.config import averaging_start_round
from strategies.fedacg import FedAcg
from strategies.fedavg import FedAvg
from strategies.fedavgm import FedAvgM
from strategies.fedcm import FedCm
from strategies.feddyn import FedDyn
from strategies.fedfa import FedFa
from strategies.fedgma import FedGMA
from strategies.fedlesam import FEDLESAM_DEFAULT_RHO, FedLesam
from strategies.fednova import FedNova
from strategies.fedopt import FedAdagrad, FedAdam, FedYogi
from strategies.fedprox import FedProx
from strategies.fedswa import FedSwa
from strategies.mime import Mime
from strategies.mofedsam import MOFEDSAM_DEFAULT_RHO, MoFedSam
from strategies.scaffold import Scaffold
from strategies.schedules import ClientSchedule

FEDOPT_CLASSES = {"fedadam": FedAdam, "fedyogi": FedYogi, "fedadagrad": FedAdagrad}
DEFAULT_SERVER_LR = {"fedadam": 0.01, "fedyogi": 0.01, "fedadagrad": 0.01, "mime": 0.1, "mimelite": 0.1}
# Models the SAM papers call CNNs (their larger ASAM radius applies to them).
SAM_CNN_MODELS = ("mlp", "fmnist-cnn", "cifar-cnn")


def build_base_strategy(config: Mapping[str, Any]) -> Strategy:
    """The base method named by ``config['strategy']`` (config already validated)."""
    # Federated evaluation is off: the ServerApp evaluates the global model centrally.
    # fraction_train=1 and no minimum: the strategy addresses exactly the sampled cohort.
    common = dict(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=0, min_available_nodes=0)
    name = config["strategy"]
    server_lr = config["server-lr"] or DEFAULT_SERVER_LR.get(name, 1.0)
    if name == "fedavg":
        return FedAvg(**common)
    if name == "scaffold":
        return Scaffold(**common)
    if name == "fedprox":
        return FedProx(**common, proximal_mu=config["prox-mu"])
    if name == "fedavgm":
        return FedAvgM(**common, server_learning_rate=server_lr, server_momentum=config["server-momentum"])
    if name in FEDOPT_CLASSES:
        moments = {} if name == "fedadagrad" else {"beta_1": config["server-momentum"], "beta_2": config["beta-2"]}
        if name == "fedadam":
            moments["bias_correction"] = config["fedadam-bias-correction"]
        return FEDOPT_CLASSES[name](**common, eta=server_lr, eta_l=config["lr"], tau=config["tau"], **moments)
    if name == "fednova":
        return FedNova(**common)
    if name == "feddyn":
        return FedDyn(**common, alpha=config["feddyn-alpha"])
    if name == "fedgma":
        return FedGMA(**common, mask_threshold=config["gma-threshold"], server_learning_rate=server_lr)
    if name in ("fedswa", "fedmoswa"):
        return FedSwa(
            **common, server_step=server_lr, rho=config["fedswa-rho"], momentum_control=name == "fedmoswa",
            gamma=config["fedmoswa-gamma"], variant=config["fedswa-variant"],
        )
    if name == "fedcm":
        return FedCm(**common, alpha=config["fedcm-alpha"], variant=config["fedcm-variant"], server_learning_rate=server_lr)
    if name == "mofedsam":
        return MoFedSam(**common, rho=config["sam-rho"] or MOFEDSAM_DEFAULT_RHO, alpha=config["fedcm-alpha"],
                        variant=config["fedcm-variant"], server_learning_rate=server_lr)
    if name == "fedlesam":
        return FedLesam(**common, rho=config["sam-rho"] or FEDLESAM_DEFAULT_RHO, variant=config["fedlesam-variant"],
                        weighting=config["fedlesam-weighting"])
    if name == "fedfa":
        return FedFa(**common, lam=config["fedfa-lambda"], rho=config["fedfa-rho"], variant=config["fedfa-variant"],
                     num_rounds=config["num-rounds"], seed=config["seed"])
    if name in ("mime", "mimelite"):
        return Mime(**common, lite=name == "mimelite", beta=config["mime-momentum"], server_learning_rate=server_lr,
                    variant=config["mime-variant"], timeout=config["round-timeout"])
    if name == "adabest":
        return AdaBest(**common, mu=config["adabest-mu"], beta=config["adabest-beta"], variant=config["adabest-variant"])
    if name == "fedacg":
        return FedAcg(**common, lam=config["fedacg-lambda"], beta=config["fedacg-beta"], variant=config["fedacg-variant"])
    if name in OBJECTIVE_SETTINGS:  # the server is FedAvg; the clients train another local objective
        # FedAlign clips its own gradients (the authors' methods/fedalign.py), not its baselines'.
        grad_clip = config["fedalign-grad-clip"] if name == "fedalign" else None
        return ClientObjectiveFedAvg(name, objective_settings(config), grad_clip=grad_clip, **common)
    raise ValueError(f"unknown strategy {name!r}")


def objective_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """Every local-objective setting, with the SAM radius and ASAM η defaults resolved
    (METHODS.md §2.2: FedASAM ρ = 0.7, η = 0.2 on CNNs, else ρ = 0.2, η = 0.05; FedSAM ρ = 0.05)."""
    cnn = resolve_model_name(config["model"], config["dataset"]) in SAM_CNN_MODELS
    default_rho = (0.7 if cnn else 0.2) if config["strategy"] == "fedasam" else 0.05
    return {
        **{key: config[key] for key in (
            "moon-mu", "moon-temperature", "fedalign-mu", "fedalign-width", "mixup-gamma", "stochdepth-survival",
            "gradaug-subnets", "gradaug-min-width", "gradaug-mu",
        )},
        "sam-rho": config["sam-rho"] or default_rho,
        "asam-eta": config["asam-eta"] or (0.2 if cnn else 0.05),
    }


def build_strategy(config: Mapping[str, Any]) -> Strategy:
    """The base method, wrapped by the averaging component when ``averaging`` is set."""
    base = build_base_strategy(config)
    averaging, start = config["averaging"], averaging_start_round(config)
    if averaging == "ima":
        # The IMA authors' ordering on FedAdam/FedYogi/FedAdagrad (strategies/averaging.py).
        optimizer_target = config["strategy"] in FEDOPT_CLASSES and config["ima-server-opt"] == "fma-target"
        return ModelAveraging(
            base, config["window"], start, feedback=True, subset=config["avg-subset"], optimizer_target=optimizer_target
        )
    if averaging == "wima":
        return ModelAveraging(
            base, config["window"], config["window"], feedback=config["avg-feedback"], subset=config["avg-subset"]
        )
    if averaging == "swa":
        cycle = config["swa-cycle"]
        if config["swa-variant"] == "official-code":
            # fedsam's models/main.py: update after rounds i > s with (i − s) mod c = 0.
            return ModelAveraging(
                base, None, start + cycle, feedback=False, sample_every=cycle, sample_phase=start,
                subset=config["avg-subset"],
            )
        return ModelAveraging(base, None, start, feedback=False, sample_every=cycle, subset=config["avg-subset"])
    return base


def build_client_schedule(config: Mapping[str, Any]) -> ClientSchedule:
    """Client lr and epochs per round, including IMA exploration and SWA's cyclic lr."""
    start = averaging_start_round(config)
    return ClientSchedule(
        lr=config["lr"],
        decay=config["lr-decay"],
        local_epochs=config["local-epochs"],
        exploration=config["ima-exploration"] if config["averaging"] == "ima" else "none",
        exploration_start=start if config["averaging"] == "ima" else 0,
        exploration_decay=config["ima-decay"],
        swa_start=start if config["averaging"] == "swa" else 0,
        swa_cycle=config["swa-cycle"] if config["averaging"] == "swa" else 0,
        # The FedSWA comparison's cosine over the rounds (every method of it), else lr-decay.
        cosine_rounds=config["num-rounds"] if config["lr-schedule"] == "cosine" else 0,
    )
