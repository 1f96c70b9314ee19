"""FedCM, server side (Xu, Wang, Wang, Yao, "FedCM: Federated Learning with Client-level
Momentum", arXiv 2106.10874; the form shared by three independent codes: woodenchild95/
FL-Simulator @ 502bec6 client/fedcm.py L19–33 and server/FedCM.py L27, L33, MediaBrain-SJTU/
FedLESAM @ d6663cc, RickZack/GHBM @ 41da4a9 fedcm_client.py L33–37 and
fedcm_center_server.py L34–43; the paper's algorithm box was not available).

The server broadcasts the previous round's average update direction; each client mixes it
into every local gradient (clients/fedcm.py):

    client step:  v = α·g + (1 − α)·Δ_t,   y ← y − η_l·(clip₁₀(v) + wd·y)
    server:       θ ← θ + η_g·(1/|S|)·Σ_i (y_i − θ)            (uniform mean; η_g = 1)
                  D = (1/|S|)·Σ_i (θ − y_i)                     (sent next round; 0 in round 1)

Δ_t is D as a per-step gradient: **default** (``fedcm-variant = per-client``, GHBM's
placement) each client divides D by its own η_l·K_i (its lr and number of local steps this
round), exact when data sizes differ; the **variant** ``server`` (FL-Simulator's) divides
at the server by the round's η_l and the K of the cohort's first client in partition order
(FL-Simulator takes client 0's, assuming balanced clients). Both are the same on balanced
clients at a constant lr. Defaults α = 0.1, η_g = 1 (``server-lr``). Beware FedSWA's code,
which writes the mix as (1 − γ)·g + γ·Δ: α = 1 − γ.

D covers the floating-point arrays of the model; the clients use the trained weights'
entries. θ is the model this strategy is given to send (under IMA the averaged model), so
D is measured from what the clients received. D is checkpointed state. Client models are
summed in partition order.
"""

from __future__ import annotations

import numpy as np

from clients.options import Option, one_of
from clients.protocol import FEDCM_ALPHA, FEDCM_DIRECTION, FEDCM_SCALE
from strategies.arrays import counter_mean, is_float, to_numpy, with_record
from strategies.cohort import COHORT
from strategies.methods import ImplementedIn, MethodSpec, TableRow
from strategies.sampling import ServerUpdate
from strategies.weighted_mean import InPlaceFedAvg


def fedcm_server_update(
    sent: dict[str, np.ndarray], client_ws: list[dict[str, np.ndarray]], server_lr: float, step_scale: float = 1.0,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(θ⁺, D⁺): θ⁺ = θ + η_g·mean_i(y_i − θ) and D⁺ = mean_i(θ − y_i)·``step_scale``
    (1, or 1/(η_l·K) for the server-scaled variant); integer buffers take the mean."""
    new_theta, direction = {}, {}
    for key, value in sent.items():
        if not is_float(value):
            new_theta[key] = counter_mean(client_ws, key, value.dtype)
            continue
        update = sum(cw[key] - value for cw in client_ws) / len(client_ws)
        new_theta[key] = (value + server_lr * update).astype(value.dtype)
        direction[key] = (-update * step_scale).astype(value.dtype)
    return new_theta, direction

FEDCM_VARIANTS = ("per-client", "server")


class FedCm(ServerUpdate, InPlaceFedAvg):
    """FedCM over a seeded cohort; the direction ``D`` is the server state."""

    client_half = "the server's momentum direction in every local step"

    def __init__(self, alpha: float = 0.1, variant: str = "per-client", server_learning_rate: float = 1.0, **kwargs):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if variant not in FEDCM_VARIANTS:
            raise ValueError(f"variant must be one of {FEDCM_VARIANTS}, got {variant!r}")
        super().__init__(**kwargs)
        self.alpha = alpha
        self.variant = variant
        self.server_learning_rate = server_learning_rate
        self.direction: dict[str, np.ndarray] | None = None
        self.round_lr = 0.0

    def configure_train(self, server_round, arrays, config, grid):
        if self.direction is None:  # Δ_0 = 0: round 1's steps are α·g
            self.direction = {key: np.zeros_like(value) for key, value in to_numpy(arrays).items() if is_float(value)}
        config[FEDCM_ALPHA] = self.alpha
        config[FEDCM_SCALE] = "client" if self.variant == "per-client" else "none"
        self.round_lr = float(config["lr"])
        return with_record(super().configure_train(server_round, arrays, config, grid), FEDCM_DIRECTION, self.direction)

    def server_update(self, models, metrics, replies):
        step_scale = 1.0
        if self.variant == "server":
            step_scale = 1.0 / (self.round_lr * int(metrics[0]["local-steps"]))
        model, self.direction = fedcm_server_update(self.sent_weights, models, self.server_learning_rate, step_scale)
        return model

    def state_dict(self) -> dict:
        """The direction D sent next round (numpy arrays; None before the first round)."""
        return {"direction": self.direction}

    def load_state_dict(self, state: dict) -> None:
        self.direction = state["direction"]


FEDCM_OPTIONS = {
    "fedcm-alpha": Option(float, "a number in (0, 1] (FedCM's weight of the local gradient: v = α·g + (1 − α)·Δ_t)",
                          lambda v: 0 < v <= 1, default=0.1),
    "fedcm-variant": one_of(*FEDCM_VARIANTS, default="per-client"),
}

METHODS: tuple[MethodSpec, ...] = (
    MethodSpec(
        "fedcm", "FedCM",
        lambda config: FedCm(**COHORT, alpha=config["fedcm-alpha"], variant=config["fedcm-variant"],
                             server_learning_rate=METHODS[0].server_lr(config)),
        partial_work=lambda config: "planned-steps" if config["fedcm-variant"] == "per-client" else "steps-taken",
        options=FEDCM_OPTIONS, client_components=(ImplementedIn("clients.fedcm:momentum_direction"),), plain_sgd=True,
        cost_table={"fedcm": {}}, smoke_runs={"fedcm": {"grad-clip": 10.0, "momentum": 0.0}},
        table_row=TableRow("FedCM (Xu et al. 2021; the form of three authors' codes): client step v = α·g + (1 − "
                           'α)·Δ_t, clipped to `grad-clip` as g would be, α = `fedcm-alpha` (0.1); server θ ← θ +'
                           ' η_g·mean_i(y_i − θ) (uniform mean, η_g = `server-lr`, default 1) and sends D = '
                           'mean_i(θ − y_i), 0 in round 1',
                           "`fedcm-variant = per-client`: each client's Δ_t = D/(η_l·K_i), its own lr and steps "
                           "(`server`: D/(η_l·K) at the server with the first client's K)"),
    ),
)
