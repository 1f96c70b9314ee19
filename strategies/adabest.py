"""AdaBest, server side (Varno et al., ECCV 2022, arXiv 2204.13170; RickZack/GHBM @ 41da4a9
center_server/adabest_center_server.py L36–48 and fed_clients/adabest_client.py L46–62,
the default; varnio/fedsim @ 5e2eba6 fedsim/distributed/centralized/training/adabest.py,
by the first author, ``optimize`` L172–188 and ``send_to_server`` L99–147, the variant).

Each client subtracts its bias estimate h_i from every local gradient (clients/adabest.py).
The server extrapolates the average of the client models away from the previous average:

    θ̄^t = avg_i y_i          (Basin's FedAvg: weighted by sample counts, GHBM's aggregation
                              weights; fedsim weighs clients equally)
    h^t = β·(θ̄^{t−1} − θ̄^t),   θ^t = θ̄^t − h^t,   θ̄^{t−1} ← θ̄^t   (θ̄^{−1} = θ_0)

h^t uses the previous *average of client models*, not the previous global model, so under
IMA (which changes what is sent) the extrapolation still follows the clients' averages.
Defaults: μ = 0.02, β = 0.85. The paper's recommended values were not available: μ is on
GHBM's scale, whose WIMA grid is μ ∈ {0.01, 0.02} (same lab as WIMA); β = 0.85 is fedsim's
default, inside WIMA's grid {0.5, …, 0.95}. β must be < 1. ``adabest-variant =
official-code`` is fedsim's client form (clients/adabest.py); its μ_ad needs m̄, the running
mean of n_j/K_j over every reply so far, which the server keeps and sends. θ̄ and m̄ are
checkpointed state. Client models are summed in partition order.
"""

from __future__ import annotations

import numpy as np

from clients.options import Option, one_of
from clients.protocol import ADABEST_MEAN_EXAMPLES_PER_STEP, ADABEST_MU, ADABEST_OFFICIAL_CODE
from strategies.arrays import counter_mean, is_float, to_numpy
from strategies.cohort import COHORT
from strategies.methods import ImplementedIn, MethodSpec, TableRow
from strategies.sampling import ServerUpdate
from strategies.weighted_mean import InPlaceFedAvg


def adabest_server_update(
    previous_average: dict[str, np.ndarray], client_ws: list[dict[str, np.ndarray]], weights: list[float], beta: float,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(θ^t, θ̄^t): θ̄^t = Σ p_i·y_i, θ^t = θ̄^t − β·(θ̄^{t−1} − θ̄^t); integer buffers: the mean."""
    total = sum(weights)
    new_theta, average = {}, {}
    for key, previous in previous_average.items():
        if not is_float(previous):
            new_theta[key] = average[key] = counter_mean(client_ws, key, previous.dtype, weights)
            continue
        average[key] = np.asarray(sum(w * cw[key].astype(np.float64) for w, cw in zip(weights, client_ws)) / total).astype(previous.dtype)
        new_theta[key] = (average[key] - beta * (previous - average[key])).astype(previous.dtype)
    return new_theta, average

ADABEST_VARIANTS = ("paper", "official-code")


class AdaBest(ServerUpdate, InPlaceFedAvg):
    """AdaBest over a seeded cohort; θ̄ (and m̄) are the server state."""

    client_half = "each client's bias estimate h_i, subtracted from its gradient"

    def __init__(self, mu: float = 0.02, beta: float = 0.85, variant: str = "paper", **kwargs):
        if mu < 0:
            raise ValueError(f"mu must be >= 0, got {mu}")
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        if variant not in ADABEST_VARIANTS:
            raise ValueError(f"variant must be one of {ADABEST_VARIANTS}, got {variant!r}")
        super().__init__(**kwargs)
        self.mu, self.beta, self.variant = mu, beta, variant
        self.previous_average: dict[str, np.ndarray] | None = None
        self.examples_per_step = (0.0, 0)  # (running mean of n_j/K_j, replies counted)

    def configure_train(self, server_round, arrays, config, grid):
        if self.previous_average is None:  # θ̄^{−1} = θ_0
            self.previous_average = to_numpy(arrays)
        config[ADABEST_MU] = self.mu
        config[ADABEST_OFFICIAL_CODE] = self.variant == "official-code"
        config[ADABEST_MEAN_EXAMPLES_PER_STEP] = self.examples_per_step[0]
        return super().configure_train(server_round, arrays, config, grid)

    def server_update(self, models, metrics, replies):
        weights = [float(m["num-examples"]) for m in metrics]
        model, self.previous_average = adabest_server_update(self.previous_average, models, weights, self.beta)
        mean, count = self.examples_per_step
        for m in metrics:
            count += 1
            mean += (float(m["num-examples"]) / max(int(m["local-steps"]), 1) - mean) / count
        self.examples_per_step = (mean, count)
        return model

    def state_dict(self) -> dict:
        """θ̄^{t−1} (numpy arrays; None before the first round) and m̄ with its count."""
        return {"previous-average": self.previous_average, "examples-per-step": list(self.examples_per_step)}

    def load_state_dict(self, state: dict) -> None:
        self.previous_average = state["previous-average"]
        self.examples_per_step = (float(state["examples-per-step"][0]), int(state["examples-per-step"][1]))


ADABEST_OPTIONS = {
    "adabest-mu": Option(float, "a number >= 0 (AdaBest's μ: the bias estimate's step)", lambda v: v >= 0, default=0.02),
    "adabest-beta": Option(float, "a number in [0, 1) (AdaBest's server extrapolation β)", lambda v: 0 <= v < 1,
                           default=0.85),
    "adabest-variant": one_of(*ADABEST_VARIANTS, default="paper"),
}

METHODS = (
    MethodSpec(
        "adabest", "AdaBest",
        lambda config: AdaBest(**COHORT, mu=config["adabest-mu"], beta=config["adabest-beta"],
                               variant=config["adabest-variant"]),
        options=ADABEST_OPTIONS, client_components=(ImplementedIn("clients.adabest:adabest_component"),), client_state=True, plain_sgd=True,
        cost_table={"adabest": {}},
        smoke_runs={"adabest+wima": {"participation": 1.0, "momentum": 0.0, "averaging": "wima", "window": 2}},
        table_row=TableRow("AdaBest (Varno et al., ECCV 2022; GHBM's form): each step g − h_i; after the round "
                           'h_i ← h_i/(t − t_i′) + μ·(θ^{t−1} − y_K), t_i′ ← t (client state); server θ̄^t = '
                           'avg_i y_i, θ^t = θ̄^t − β·(θ̄^{t−1} − θ̄^t); μ = `adabest-mu` (0.02), β = '
                           '`adabest-beta` (0.85)',
                           "`adabest-variant = paper` (`official-code`: fedsim's g − μ_ad·h_i, μ_ad = μ·m̄·E/n_i,"
                           ' h_i update without μ)'),
    ),
)
