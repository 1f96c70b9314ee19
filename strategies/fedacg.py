"""FedACG, server side (Kim, Kim, Han, "Communication-Efficient Federated Learning with
Accelerated Client Gradient", CVPR 2024, arXiv 2201.03172; the authors' code
geehokim/FedACG @ 62b6e95: servers/base.py L49–74, trainers/base_trainer.py L181–235,
clients/base_client.py L200–205).

The server keeps a momentum m of past global updates (m_0 = 0) and broadcasts a
look-ahead model instead of θ. Round t:

    θ̃ = θ + λ·m                                  (sent; clients start from it)
    client i: SGD on CE(y; ζ) + β·‖y − θ̃‖²        (gradient term 2β·(y − θ̃): no ½)
    Δ̄ = (1/|S|)·Σ_i (y_i − θ̃)                    (uniform mean)
    m ← λ·m + Δ̄
    θ ← θ̃ + Δ̄ = θ + m                            (evaluated; no separate server lr)

Defaults λ = 0.85, β = 1e-3 (the authors' configs). The proximal term is FedProx's
client hook with μ = 2β (``proximal-mu``); the variant ``fedacg-variant = half`` uses the
(β/2)·‖·‖² the paper may write (μ = β; the paper's text is not confirmed). Momentum and
the look-ahead cover every floating-point array of the model, BatchNorm running
statistics included, as the authors' code does; integer buffers (``num_batches_tracked``)
take the cohort's mean and no momentum. θ is the model this strategy is given to send:
under IMA the averaged model, so the look-ahead and Δ̄ are taken against what the clients
received. m is checkpointed state (:meth:`FedAcg.state_dict`). Client models are summed in
partition order.
"""

from __future__ import annotations

import numpy as np

from clients.options import Option, one_of
from strategies.arrays import counter_mean, is_float, to_arrays, to_numpy
from strategies.cohort import COHORT
from strategies.methods import ImplementedIn, MethodSpec, TableRow
from strategies.sampling import ServerUpdate
from strategies.weighted_mean import InPlaceFedAvg


def lookahead(theta: dict[str, np.ndarray], momentum: dict[str, np.ndarray], lam: float) -> dict[str, np.ndarray]:
    """θ̃ = θ + λ·m on floating-point arrays (integer buffers as they are)."""
    return {key: (value + lam * momentum[key]).astype(value.dtype) if is_float(value) else value
            for key, value in theta.items()}


def fedacg_server_update(
    sent: dict[str, np.ndarray], momentum: dict[str, np.ndarray], client_ws: list[dict[str, np.ndarray]], lam: float,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(m⁺, θ⁺) from the sent look-ahead θ̃, m and the cohort's models: Δ̄ = mean_i(y_i − θ̃),
    m⁺ = λ·m + Δ̄, θ⁺ = θ̃ + Δ̄."""
    new_momentum, new_theta = {}, {}
    for key, value in sent.items():
        if not is_float(value):
            new_theta[key] = counter_mean(client_ws, key, value.dtype)
            continue
        update = sum(cw[key] - value for cw in client_ws) / len(client_ws)
        new_momentum[key] = (lam * momentum[key] + update).astype(value.dtype)
        new_theta[key] = (value + update).astype(value.dtype)
    return new_momentum, new_theta

FEDACG_VARIANTS = ("code", "half")


class FedAcg(ServerUpdate, InPlaceFedAvg):
    """FedACG over a seeded cohort; the momentum ``m`` is the server state."""

    client_half = "the proximal term to the look-ahead model"

    def __init__(self, lam: float = 0.85, beta: float = 1e-3, variant: str = "code", **kwargs):
        if not 0.0 <= lam < 1.0:
            raise ValueError(f"lam must be in [0, 1), got {lam}")
        if beta < 0:
            raise ValueError(f"beta must be >= 0, got {beta}")
        if variant not in FEDACG_VARIANTS:
            raise ValueError(f"variant must be one of {FEDACG_VARIANTS}, got {variant!r}")
        super().__init__(**kwargs)
        self.lam = lam
        self.beta = beta
        self.variant = variant
        self.momentum: dict[str, np.ndarray] | None = None

    def configure_train(self, server_round, arrays, config, grid):
        theta = to_numpy(arrays)
        if self.momentum is None:
            self.momentum = {key: np.zeros_like(value) for key, value in theta.items() if is_float(value)}
        # The client's regularizer β‖y − θ̃‖² (or (β/2)‖·‖²), as FedProx's hook μ(y − θ̃).
        config["proximal-mu"] = 2 * self.beta if self.variant == "code" else self.beta
        return super().configure_train(server_round, to_arrays(lookahead(theta, self.momentum, self.lam)), config, grid)

    def server_update(self, models, metrics, replies):
        self.momentum, model = fedacg_server_update(self.sent_weights, self.momentum, models, self.lam)
        return model

    def state_dict(self) -> dict:
        """The server momentum m (numpy arrays; None before the first round)."""
        return {"momentum": self.momentum}

    def load_state_dict(self, state: dict) -> None:
        self.momentum = state["momentum"]


METHODS = (
    MethodSpec(
        "fedacg", "FedACG",
        lambda config: FedAcg(**COHORT, lam=config["fedacg-lambda"], beta=config["fedacg-beta"],
                              variant=config["fedacg-variant"]),
        options={
            "fedacg-lambda": Option(float, "a number in [0, 1) (FedACG's momentum and look-ahead λ)",
                                    lambda v: 0 <= v < 1, default=0.85),
            "fedacg-beta": Option(float, "a number >= 0 (FedACG's proximal weight β of β·‖y − θ̃‖²)",
                                  lambda v: v >= 0, default=0.001),
            "fedacg-variant": one_of(*FEDACG_VARIANTS, default="code"),
        },
        client_components=(ImplementedIn("clients.components:proximal"),), plain_sgd=True, cost_table={"fedacg": {}},
        smoke_runs={"fedacg+ima": {"momentum": 0.0, "averaging": "ima", "window": 2, "avg-start": 2}},
        table_row=TableRow("FedACG (Kim et al., CVPR 2024; the authors' code): the server sends the look-ahead θ̃"
                           ' = θ + λ·m; clients minimise CE + β·‖y − θ̃‖² (gradient 2β(y − θ̃)); m ← λ·m + '
                           'mean_i(y_i − θ̃), θ ← θ̃ + mean_i(y_i − θ̃); λ = `fedacg-lambda` (0.85), β = '
                           '`fedacg-beta` (1e-3)',
                           '`fedacg-variant = code` (β‖·‖²; `half`: (β/2)‖·‖², as the paper may write it)'),
    ),
)
