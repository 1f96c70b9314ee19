"""FedDyn, server side (Acar, Zhao, Matas, Mattina, Whatmough, Saligrama; ICLR 2021,
"Federated Learning Based on Dynamic Regularization", Algorithm 1; METHODS.md §2.2).

The server sends θ^{t−1} and α (config entry ``FEDDYN_ALPHA``); each client k in the
round's cohort P trains its dynamically regularized objective (clients/feddyn.py) and
replies with θ_k^t. Then, with m the total number of clients,

    h^t = h^{t−1} − α·(1/m)·Σ_{k∈P} (θ_k^t − θ^{t−1})
    θ^t = (1/|P|)·Σ_{k∈P} θ_k^t − (1/α)·h^t

h starts at zero and is checkpointed state (:meth:`FedDyn.state_dict`).

Differences: the mean over the cohort is uniform, as in the paper, not weighted by sample
counts like every FMA in this project (FedDyn's h correction assumes the uniform mean).
θ^{t−1} is the model the clients received, so under IMA h is driven by the averaged
model (METHODS.md §1.1). Flower has no FedDyn. Client models are summed in partition
order.
"""

from __future__ import annotations

import numpy as np

from clients.options import Option
from clients.protocol import FEDDYN_ALPHA
from strategies.arrays import to_numpy
from strategies.cohort import COHORT
from strategies.methods import ImplementedIn, MethodSpec, TableRow
from strategies.sampling import ServerUpdate
from strategies.weighted_mean import InPlaceFedAvg


def feddyn_server_update(
    h: dict[str, np.ndarray],
    global_w: dict[str, np.ndarray],
    client_ws: list[dict[str, np.ndarray]],
    alpha: float,
    num_clients: int,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(h^t, θ^t) from h^{t−1}, θ^{t−1} and the cohort's models; m = ``num_clients``."""
    new_h = {
        key: (h[key] - alpha / num_clients * sum(cw[key] - w for cw in client_ws)).astype(h[key].dtype)
        for key, w in global_w.items()
    }
    new_w = {
        key: (sum(cw[key] for cw in client_ws) / len(client_ws) - new_h[key] / alpha).astype(w.dtype)
        for key, w in global_w.items()
    }
    return new_h, new_w


class FedDyn(ServerUpdate, InPlaceFedAvg):
    """FedDyn over a seeded cohort; ``h`` is the server state, sent α is ``alpha``."""

    client_half = "each client's linear term −∇L_k(θ_k^{t−1}) and proximal term"

    def __init__(self, alpha: float = 0.01, **kwargs):
        if alpha <= 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        super().__init__(**kwargs)
        self.alpha = alpha
        self.h: dict[str, np.ndarray] | None = None

    def configure_train(self, server_round, arrays, config, grid):
        if self.h is None:
            self.h = {k: np.zeros_like(v) for k, v in to_numpy(arrays).items()}
        # The client's regularizer needs α (sent the way Flower's FedProx sends μ).
        config[FEDDYN_ALPHA] = self.alpha
        return super().configure_train(server_round, arrays, config, grid)

    def server_update(self, models, metrics, replies):
        self.h, model = feddyn_server_update(self.h, self.sent_weights, models, self.alpha, len(self.partition_of_node))
        return model

    def state_dict(self) -> dict:
        """The server state h (numpy arrays; None before the first round)."""
        return {"h": self.h}

    def load_state_dict(self, state: dict) -> None:
        self.h = state["h"]


METHODS = (
    MethodSpec(
        "feddyn", "FedDyn", lambda config: FedDyn(**COHORT, alpha=config["feddyn-alpha"]),
        options={"feddyn-alpha": Option(float, "a number > 0 (FedDyn's α)", lambda v: v > 0, default=0.01)},
        client_components=(ImplementedIn("clients.feddyn:feddyn_component"),), client_state=True,
        smoke_runs={"feddyn": {"participation": 1.0}},
        table_row=TableRow('FedDyn (Acar et al. 2021) Algorithm 1, α = `feddyn-alpha`',
                           '—'),
    ),
)
