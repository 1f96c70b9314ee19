"""Adaptive server optimizers (Reddi et al., ICLR 2021, Algorithm 2): FedAdam, FedYogi,
FedAdagrad, over Basin's seeded cohorts.

Δ_t = x_t − w_t with x_t the step's **target** (the FMA by default);
m_t = β1·m_{t−1} + (1 − β1)·Δ_t;
Adam: v_t = β2·v_{t−1} + (1 − β2)·Δ_t²; Yogi: v_t = v_{t−1} − (1 − β2)·Δ_t²·sign(v_{t−1} − Δ_t²);
Adagrad: v_t = v_{t−1} + Δ_t²; w_{t+1} = w_t + η·m_t/(√v_t + τ). Defaults η = 0.01,
β1 = 0.9, β2 = 0.99, τ = 1e-3 (Reddi et al.'s grid; the IMA and WIMA setups; the IMA
authors' ``utils/aggregator.py`` uses exactly these for FedAdam and FedYogi).

The target is a hook, :meth:`ServerOptimizer.step_target`: IMA's default ordering on these
optimisers (strategies/averaging_wrappers.py, ``ima-server-opt = fma-target``) replaces it from t_s
on by the mean of a window of FMA aggregates, and resets the moments once at t_s
(:meth:`ServerOptimizer.reset_moments`), as the IMA authors' ``fedadam+ima`` and
``fedyogi+ima`` modes do.

Flower's FedAdam multiplies η by Adam's bias correction √(1 − β2^(t+1))/(1 − β1^(t+1))
(Kingma & Ba), which Reddi et al.'s Algorithm 2 does not have: in round 1 that is
η·√0.0199/0.19 ≈ 0.74·η, and it tends to η. Basin's FedAdam takes the paper's step by
default; ``bias_correction=True`` (run config ``fedadam-bias-correction = true``) gives
Flower's. FedYogi and FedAdagrad take Flower's steps (which follow the paper), here
written once for the three. The arrays recorded in ``configure_train`` (Flower's
``current_arrays``) are the model the clients received, so under IMA's older ordering the
pseudo-gradient is taken against the averaged model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp.strategy import FedAdagrad as FlowerFedAdagrad
from flwr.serverapp.strategy import FedAdam as FlowerFedAdam
from flwr.serverapp.strategy import FedYogi as FlowerFedYogi

from clients.options import Option
from strategies.arrays import to_arrays, to_numpy
from strategies.cohort import COHORT
from strategies.fedavgm import SERVER_MOMENTUM
from strategies.methods import MethodSpec, TableRow
from strategies.sampling import CohortSampling
from strategies.weighted_mean import InPlaceFedAvg

Arrays = dict[str, np.ndarray]


class ServerOptimizer(CohortSampling):
    """Mixin (listed first) for Flower's FedOpt family: the FMA, a step target, then the
    optimiser's step from the model sent (``current_arrays``) towards that target."""

    # Whether IMA's fma-target ordering zeroes m and v at t_s: the IMA authors' code does
    # for FedAdam and FedYogi, not for FedAdagrad (whose v only accumulates).
    resets_moments_at_averaging_start = True
    # Flower's FedOpt's attributes (the class this mixin is combined with sets them).
    eta: float
    tau: float
    beta_1: float
    current_arrays: Arrays | None
    m_t: Arrays | None
    v_t: Arrays | None

    def step_target(self, server_round: int, fma: Arrays) -> Arrays:
        """The model the round's step moves towards: the FMA of the replies."""
        return fma

    def reset_moments(self) -> None:
        """m = v = 0 (allocated at the next step)."""
        self.m_t, self.v_t = None, None

    def second_moment(self, v: np.ndarray, delta: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def step_size(self, server_round: int) -> float:
        return self.eta

    def aggregate_accepted(self, server_round: int, replies) -> tuple[ArrayRecord | None, MetricRecord | None]:
        fma, metrics = InPlaceFedAvg.aggregate_train(self, server_round, replies)  # type: ignore[arg-type]  # combined with it
        if fma is None:
            return fma, metrics
        return to_arrays(self.step(server_round, self.step_target(server_round, to_numpy(fma)))), metrics

    def step(self, server_round: int, target: Arrays) -> Arrays:
        """w + η·m/(√v + τ) with Δ = target − w (w: ``current_arrays``, the model sent)."""
        if self.current_arrays is None or set(target) != set(self.current_arrays):
            raise ValueError("the step target's arrays do not match the model sent (configure_train first)")
        delta = {k: target[k] - w for k, w in self.current_arrays.items()}
        m_t = self.m_t or {k: np.zeros_like(d) for k, d in delta.items()}
        v_t = self.v_t or {k: np.zeros_like(d) for k, d in delta.items()}
        self.m_t = m_t = {k: self.beta_1 * m + (1 - self.beta_1) * delta[k] for k, m in m_t.items()}
        self.v_t = v_t = {k: self.second_moment(v, delta[k]) for k, v in v_t.items()}
        eta = self.step_size(server_round)
        return {
            k: (w + eta * m_t[k] / (np.sqrt(v_t[k]) + self.tau)).astype(w.dtype)
            for k, w in self.current_arrays.items()
        }


class FedAdam(ServerOptimizer, FlowerFedAdam, InPlaceFedAvg):
    """FedAdam over a seeded cohort: Reddi et al.'s step, or Flower's bias-corrected one."""

    def __init__(self, *args, bias_correction: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.bias_correction = bias_correction

    def second_moment(self, v, delta):
        return self.beta_2 * v + (1 - self.beta_2) * delta**2

    def step_size(self, server_round):
        if not self.bias_correction:
            return self.eta
        return self.eta * np.sqrt(1 - np.power(self.beta_2, server_round + 1.0)) / (
            1 - np.power(self.beta_1, server_round + 1.0)
        )


class FedYogi(ServerOptimizer, FlowerFedYogi, InPlaceFedAvg):
    """FedYogi over a seeded cohort."""

    def second_moment(self, v, delta):
        return v - (1.0 - self.beta_2) * delta**2 * np.sign(v - delta**2)


class FedAdagrad(ServerOptimizer, FlowerFedAdagrad, InPlaceFedAvg):
    """FedAdagrad over a seeded cohort (β1 = 0, as Flower's)."""

    resets_moments_at_averaging_start = False

    def second_moment(self, v, delta):
        return v + delta**2


FEDOPT_OPTIONS = {
    "server-momentum": SERVER_MOMENTUM,
    "beta-2": Option(float, "a number in [0, 1) (FedAdam/FedYogi second moment)", lambda v: 0 <= v < 1, default=0.99),
    "tau": Option(float, "a number > 0 (FedOpt adaptivity)", lambda v: v > 0, default=0.001),
    "fedadam-bias-correction": Option(bool,
            "true or false (Flower's Adam bias correction of FedAdam's step; false: Reddi et al.'s Algorithm 2)",
            default=False),
}


def _fedopt(name: str, display_name: str, cls: type[ServerOptimizer],
            smoke_runs: dict[str, dict[str, Any]], table_row: TableRow | None = None) -> MethodSpec:
    def build(config):
        moments = {} if cls is FedAdagrad else {"beta_1": config["server-momentum"], "beta_2": config["beta-2"]}
        if cls is FedAdam:
            moments["bias_correction"] = config["fedadam-bias-correction"]
        return cls(**COHORT, eta=spec.server_lr(config), eta_l=config["lr"], tau=config["tau"], **moments)

    options = {key: FEDOPT_OPTIONS[key] for key in ("tau",)} if cls is FedAdagrad else (
        FEDOPT_OPTIONS if cls is FedAdam else {k: v for k, v in FEDOPT_OPTIONS.items() if k != "fedadam-bias-correction"})
    spec = MethodSpec(name, display_name, build, options=options, default_server_lr=0.01, dp_aggregate="step-on-mean",
                      smoke_runs=smoke_runs,
                      table_row=table_row)
    return spec


METHODS = (
    # FedAdam+IMA end to end: tests/test_checkpoint_resume.py (its uninterrupted run).
    _fedopt("fedadam", "FedAdam", FedAdam, smoke_runs={},
            table_row=TableRow('Reddi et al. (ICLR 2021) Algorithm 2, η = 0.01, β1 = 0.9, β2 = 0.99, τ = 1e-3',
                               "FedAdam: the paper's step w + η·m/(√v + τ) (`fedadam-bias-correction = true`: "
                               "Flower's Adam bias correction). Under IMA: `ima-server-opt = fma-target` (the IMA"
                               " authors' ordering: the window holds FMA aggregates, from t_s their mean is the "
                               "step's target, Δ = mean − w, and m, v are reset at t_s — not FedAdagrad's; "
                               "`output-window`: the window holds the optimiser's outputs and their mean is sent)")),
    _fedopt("fedyogi", "FedYogi", FedYogi,
            smoke_runs={"fedyogi+ima": {"server-lr": 0.05, "averaging": "ima", "window": 2, "avg-start": 2}}),
    _fedopt("fedadagrad", "FedAdagrad", FedAdagrad, smoke_runs={"fedadagrad": {"server-lr": 0.05, "num-rounds": 2}}),
)
