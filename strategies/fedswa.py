"""FedSWA and FedMoSWA, server side (ICML 2025, "momentum-based stochastic controlled
weight averaging"; Algorithm 1; METHODS.md §1.4).

Paper (``variant="paper"``, the default). Clients run K local steps whose lr decays
linearly inside the round, η_k = η_l·(1 − k/K) + (k/K)·ρ·η_l (``clients.training.in_round_lrs``; the
server sends the start and end factors 1 and ρ as ``STEP_LR_START``/``STEP_LR_END``).
FedMoSWA (``momentum_control=True``) also sends the server control m
(``MOSWA_SERVER_CONTROL``, zero at first); client i steps with g_i − c_i + m and replies
with Δc_i = c_i⁺ − m (``MOSWA_DELTA_CONTROL``; Algorithm 1 line 14). With s the number of
replies:

    m ← m + γ·(1/s)·Σ_i Δc_i = (1 − γ)·m + γ·mean_i c_i⁺     (:func:`moswa_control_update`)
    v_t = (1/s)·Σ_i θ_{i,K};  θ_t = θ_{t−1} + α·(v_t − θ_{t−1})   (:func:`swa_server_update`)

so m is a momentum of the cohort's control variates, not SCAFFOLD's (s/N)-scaled sum of
changes; γ = 0.4 by default (the value the authors' code fixes).

Authors' public code (``variant="official-code"``): its in-round lr factors, step count,
control update and local optimizer, as :class:`FedSwa` describes.

Differences: v_t is the uniform mean of the cohort's models, as in Algorithm 1, not
weighted by sample counts like every FMA in this project. θ_{t−1} is the model the
clients received (under IMA, the average; METHODS.md §1.1). Flower has neither method.
Client models and controls are summed in partition order; m is checkpointed state
(the ``control`` attribute, which strategies/checkpoint.py already saves).
"""

from __future__ import annotations

import numpy as np

from clients.options import Option, one_of
from clients.protocol import (
    CONTROL_AFTER_CLIP,
    CONTROL_STEP_COUNT,
    LOCAL_STEPS,
    MOSWA_DELTA_CONTROL,
    MOSWA_NEW_CONTROL,
    MOSWA_SERVER_CONTROL,
    STEP_LR_END,
    STEP_LR_START,
)
from strategies.arrays import to_arrays, to_numpy, with_record
from strategies.cohort import COHORT
from strategies.methods import ImplementedIn, MethodSpec, TableRow
from strategies.sampling import CohortSampling
from strategies.weighted_mean import InPlaceFedAvg

VARIANTS = ("paper", "official-code")
OFFICIAL_MOSWA_LOCAL_STEPS = 50
OFFICIAL_CONTROL_DECAY = 0.6  # m ← 0.6·m + 0.4·mean c_i⁺ in the authors' code


def swa_server_update(
    global_w: dict[str, np.ndarray], client_ws: list[dict[str, np.ndarray]], server_step: float
) -> dict[str, np.ndarray]:
    """θ + α·(v − θ) with v the uniform mean of the client models."""
    return {
        key: (w + server_step * (sum(cw[key] for cw in client_ws) / len(client_ws) - w)).astype(w.dtype)
        for key, w in global_w.items()
    }


def moswa_control_update(
    control: dict[str, np.ndarray], deltas: list[dict[str, np.ndarray]], gamma: float
) -> dict[str, np.ndarray]:
    """Paper: m + γ·(1/s)·Σ Δc_i with Δc_i = c_i⁺ − m."""
    return {
        key: (m + gamma * sum(d[key] for d in deltas) / len(deltas)).astype(m.dtype) for key, m in control.items()
    }


def official_control_update(
    control: dict[str, np.ndarray], new_controls: list[dict[str, np.ndarray]], first: bool = False
) -> dict[str, np.ndarray]:
    """Authors' code: 0.6·m + 0.4·mean c_i⁺; in the first round m = mean c_i⁺."""
    decay = 0.0 if first else OFFICIAL_CONTROL_DECAY
    return {
        key: (decay * m + (1 - decay) * sum(c[key] for c in new_controls) / len(new_controls)).astype(m.dtype)
        for key, m in control.items()
    }


class FedSwa(CohortSampling, InPlaceFedAvg):
    """FedSWA, or FedMoSWA with ``momentum_control=True``, over a seeded cohort.

    Parameters
    ----------
    server_step : float
        α, the server's step towards the clients' mean model (1 = plain averaging).
    rho : float
        ρ, the in-round lr factor reached at the last local step (paper variant).
    momentum_control : bool
        FedMoSWA: exchange control variates with the clients.
    gamma : float
        γ, the server control's step (paper variant of FedMoSWA).
    variant : str
        'paper' (Algorithm 1) or 'official-code' (the authors' public code).

    Authors' public code (``variant="official-code"``): FedSWA's in-round lr decays from
    2·η_l to 0 (factors 2 and 0); FedMoSWA uses a constant in-round lr (factors 1 and 1) and
    K = 50 local steps (``LOCAL_STEPS``; a client with fewer batches runs min(50, E·⌈n/B⌉)) and
    divides its control update by η·50 whatever it ran (``CONTROL_STEP_COUNT``), clients reply
    with c_i⁺ (``MOSWA_NEW_CONTROL``) and the server control is an EMA, m ← 0.6·m + 0.4·mean_i c_i⁺,
    except in its first round, where m = mean_i c_i⁺ (γ = 1; :func:`official_control_update`;
    γ is unused there, the code fixes it to 0.4); the model update w += lg·mean(Δw), lg = 1,
    is the same α-step, taken with ``server_step``. What no variant reproduces: the code
    keeps no control variate per client (each sampled client starts from the server's), so
    Basin's per-client c_i (kept in the client's state) is the paper's, in both variants. The code's local optimizer is sent too:
    plain SGD (momentum 0), weight decay 1e-3, grad-norm clip 10; its MoFedSWA clips the
    gradient first and then adds the correction m − c_i (``CONTROL_AFTER_CLIP``; the paper
    and SCAFFOLD correct the gradient before any clipping). Its cosine round lr is not part
    of the method: the code gives it to every algorithm of the comparison, so it is the run
    config's ``lr-schedule = cosine``, which the FedSWA presets set for all methods.
    """

    client_half = "the in-round lr schedule (and FedMoSWA's control variates)"

    def __init__(
        self,
        server_step: float = 1.0,
        rho: float = 0.1,
        momentum_control: bool = False,
        gamma: float = 0.4,
        variant: str = "paper",
        **kwargs,
    ):
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if not 0 < gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        if server_step <= 0:
            raise ValueError(f"server_step must be > 0, got {server_step}")
        if rho < 0:
            raise ValueError(f"rho must be >= 0, got {rho}")
        super().__init__(**kwargs)
        self.server_step = server_step
        self.rho = rho
        self.momentum_control = momentum_control
        self.gamma = gamma
        self.variant = variant
        self.control: dict[str, np.ndarray] | None = None
        self.control_updated = False  # whether m has had an update (the official code's first round sets it)
        self.sent_weights: dict[str, np.ndarray] | None = None

    def client_settings(self) -> dict[str, float | int]:
        """The config entries clients receive: in-round lr factors, local steps and, for the
        official code, its optimizer settings (overriding the run config's)."""
        if self.variant == "paper":
            return {STEP_LR_START: 1.0, STEP_LR_END: self.rho, LOCAL_STEPS: 0}
        optimizer = {"momentum": 0.0, "nesterov": False, "weight-decay": 1e-3, "grad-clip": 10.0}
        if self.momentum_control:
            return {
                STEP_LR_START: 1.0, STEP_LR_END: 1.0, LOCAL_STEPS: OFFICIAL_MOSWA_LOCAL_STEPS,
                CONTROL_STEP_COUNT: OFFICIAL_MOSWA_LOCAL_STEPS, CONTROL_AFTER_CLIP: True, **optimizer,
            }
        return {STEP_LR_START: 2.0, STEP_LR_END: 0.0, LOCAL_STEPS: 0, **optimizer}

    def configure_train(self, server_round, arrays, config, grid):
        self.sent_weights = to_numpy(arrays)
        for key, value in self.client_settings().items():
            config[key] = value
        messages = super().configure_train(server_round, arrays, config, grid)
        if not self.momentum_control:
            return messages
        if self.control is None:
            self.control = {k: np.zeros_like(v) for k, v in self.sent_weights.items()}
        return with_record(messages, MOSWA_SERVER_CONTROL, self.control)

    def aggregate_accepted(self, server_round, replies):
        arrays, metrics = super().aggregate_accepted(server_round, replies)
        if arrays is None:
            return arrays, metrics
        if self.momentum_control:
            needed = MOSWA_DELTA_CONTROL if self.variant == "paper" else MOSWA_NEW_CONTROL
            controls = [to_numpy(record) for record in self.declared_records(needed)]
            if self.variant == "paper":
                self.control = moswa_control_update(self.control, controls, self.gamma)
            else:
                self.control = official_control_update(self.control, controls, first=not self.control_updated)
            self.control_updated = True
        client_ws = [to_numpy(r.content[self.arrayrecord_key]) for r in replies]
        return to_arrays(swa_server_update(self.sent_weights, client_ws, self.server_step)), metrics

    def state_dict(self) -> dict:
        """The server control m (numpy arrays; None before the first round or for FedSWA)."""
        return {"control": self.control, "control-updated": self.control_updated}

    def load_state_dict(self, state: dict) -> None:
        self.control = state["control"]
        self.control_updated = bool(state.get("control-updated", self.control is not None))


FEDSWA_OPTIONS = {
    "fedswa-variant": one_of(*VARIANTS, default="paper"),
    "fedswa-rho": Option(float, "a number in [0, 1] (FedSWA's in-round lr end factor ρ)", lambda v: 0 <= v <= 1,
                         default=0.1),
}


def _build(config, momentum_control: bool) -> FedSwa:
    return FedSwa(
        **COHORT, server_step=METHODS[0].server_lr(config), rho=config["fedswa-rho"], momentum_control=momentum_control,
        gamma=config["fedmoswa-gamma"], variant=config["fedswa-variant"],
    )


METHODS = (
    MethodSpec("fedswa", "FedSWA", lambda config: _build(config, False), options=FEDSWA_OPTIONS,
               table_row=TableRow('FedSWA / FedMoSWA (Liu et al., ICML 2025) Algorithm 1: in-round lr η_k = η(1 −'
                                  ' k/K) + (k/K)ρη, ρ = `fedswa-rho`; FedMoSWA step g − c_i + m, c_i⁺ = c_i − m +'
                                  ' (θ − θ_K)/Σ η_k, sends c_i⁺ − m (line 14), m ← (1 − γ)m + γ·mean c_i⁺, γ = '
                                  '`fedmoswa-gamma` (0.4); θ ← θ + α(v − θ), α = `server-lr`',
                                  '`fedswa-variant = paper` (`official-code`: FedSWA from 2η to 0, MoFedSWA K = '
                                  '50 constant-lr steps, wd 1e-3, clip 10, correction added after clipping, EMA '
                                  '0.6/0.4)')),
    MethodSpec(
        "fedmoswa", "FedMoSWA", lambda config: _build(config, True),
        partial_work=lambda config: "fixed-count" if config["fedswa-variant"] == "official-code" else "steps-taken",
        options={**FEDSWA_OPTIONS, "fedmoswa-gamma": Option(float,
            "a number in (0, 1] (FedMoSWA's server control momentum γ: m ← (1 − γ)·m + γ·mean c_i⁺)",
            lambda v: 0 < v <= 1, default=0.4)},
        client_components=(ImplementedIn("clients.control_variates:control_variate", (MOSWA_SERVER_CONTROL,)),), client_state=True,
        reply_records={MOSWA_DELTA_CONTROL: "Δc_i = c_i⁺ − m, the client's control variate less the server's",
                       MOSWA_NEW_CONTROL: "c_i⁺, the client's new control variate"},
        # The paper's variant derives its control on plain local SGD steps.
        plain_sgd=lambda config: config["fedswa-variant"] == "paper",
        smoke_runs={
            "fedmoswa+ima": {"participation": 1.0, "momentum": 0.0, "lr": 0.1, "averaging": "ima", "window": 2,
                             "avg-start": 3},
            # The FedSWA comparison's round schedule (lr-schedule = cosine, every method of it).
            "fedmoswa-official-code": {"fedswa-variant": "official-code", "num-rounds": 2, "lr-schedule": "cosine"},
        },
    ),
)
