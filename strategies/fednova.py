"""FedNova, server side (Wang, Liu, Liang, Joshi, Tanaka; NeurIPS 2020, "Tackling the
Objective Inconsistency Problem in Heterogeneous Federated Optimization"; METHODS.md §2.2).

Client i's local solver moves the model by w − w_i = η·G_i·a_i, where G_i stacks its
local stochastic gradients and a_i weights them. FedNova averages the *normalized*
updates d_i = G_i·a_i/‖a_i‖₁ and rescales by an effective number of steps:

    w^{t+1} = w^t − τ_eff·Σ_i p_i·η·d_i,   τ_eff = Σ_i p_i·‖a_i‖₁,   p_i = n_i/Σ_j n_j

(the paper's generalized update rule with weights p_i, §4–5). Because η·d_i =
(w − w_i)/‖a_i‖₁, the server needs only the client models and ‖a_i‖₁, which each client
reports in its metrics as ``SOLVER_A_NORM``. For K steps of SGD with momentum ρ
(PyTorch form v ← ρv + g, w ← w − ηv) a_i = [1 − ρ^K, …, 1 − ρ², 1 − ρ]/(1 − ρ), so
‖a_i‖₁ = Σ_{k=1}^{K} (1 − ρ^k)/(1 − ρ) (``clients.training.momentum_a_norm``); ρ = 0 gives K.

Differences: p_i is normalized over the round's cohort (the paper's p_i are data
fractions over all clients; with partial participation the cohort's weights must sum to
1 for the update to stay an average); no server momentum (the authors' code offers one,
"gmf"; METHODS.md's FedNova has none). Flower has no FedNova. Updates are summed in
partition order.
"""

from __future__ import annotations

import numpy as np

from clients.options import ConfigError
from clients.protocol import SOLVER_A_NORM
from strategies.cohort import COHORT
from strategies.methods import MethodSpec, TableRow
from strategies.sampling import ServerUpdate
from strategies.weighted_mean import InPlaceFedAvg


def fednova_aggregate(
    global_w: dict[str, np.ndarray],
    client_ws: list[dict[str, np.ndarray]],
    num_examples: list[int],
    a_norms: list[float],
) -> dict[str, np.ndarray]:
    """w − τ_eff·Σ p_i·(w − w_i)/‖a_i‖₁ with p_i = n_i/Σn and τ_eff = Σ p_i·‖a_i‖₁."""
    total = sum(num_examples)
    weights = [n / total for n in num_examples]
    tau_eff = sum(p * a for p, a in zip(weights, a_norms))
    return {
        key: (w - tau_eff * sum(p * (w - cw[key]) / a for p, cw, a in zip(weights, client_ws, a_norms))).astype(w.dtype)
        for key, w in global_w.items()
    }


class FedNova(ServerUpdate, InPlaceFedAvg):
    """Normalized averaging over a seeded cohort; clients report ‖a_i‖₁ in their metrics."""

    client_half = "each client's ‖a_i‖₁ (the metric solver-a-norm) in its reply"

    def server_update(self, models, metrics, replies):
        for reply, metrics_of_client in zip(replies, metrics):
            if SOLVER_A_NORM not in metrics_of_client:
                raise ValueError(
                    f"FedNova: the reply of node {reply.metadata.src_node_id} has no '{SOLVER_A_NORM}' metric; "
                    "the client must report ‖a_i‖₁ of its local solver"
                )
        num_examples = [m[self.weighted_by_key] for m in metrics]
        a_norms = [float(m[SOLVER_A_NORM]) for m in metrics]
        return fednova_aggregate(self.sent_weights, models, num_examples, a_norms)


def _check(config) -> None:
    if config["nesterov"]:
        raise ConfigError(
            "run config key 'nesterov' = true cannot run strategy = 'fednova', whose normalisation ‖a_i‖₁ is "
            "derived for heavy-ball momentum; allowed: nesterov = false with fednova"
        )


METHODS = (MethodSpec("fednova", "FedNova", lambda config: FedNova(**COHORT), check=_check,
                      smoke_runs={"fednova+ima": {"averaging": "ima", "window": 2, "avg-start": 2}},
                      table_row=TableRow('FedNova (Wang et al. 2020) eq. 6–7: updates normalised by the client '
                                         "solver's ‖a_i‖₁ (momentum-aware)",
                                         'heavy-ball momentum (Nesterov refused)'),
),)
