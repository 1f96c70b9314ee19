"""FedLESAM, server side (Fan et al., ICML 2024, arXiv 2405.18890; the authors' code
MediaBrain-SJTU/FedLESAM @ d6663cc server/FedLESAM.py L25–30, client/fedlesam.py L16–30,
optimizer/LESAM.py L22–76, with FedSWA's fix of its per-tensor indexing, junkangLiu0/
FedSWA @ f725be9 optimizer/LESAM.py L21–47).

The clients perturb along a locally estimated global ascent direction
(clients/objectives/fedlesam.py); the server is FedAvg, θ ← θ + η_g·avg Δ_i with η_g = 1
and the **uniform** mean over the cohort by default, as the authors' ``server/server.py``
(and the FedSWA comparison's code) take it, like Basin's FedCM, MoFedSAM and FedACG;
``weighting="samples"`` (run config ``fedlesam-weighting = samples``) weights by n_i as
Basin's FedAvg does. **Default** (``fedlesam-variant = paper``):
each client uses the global model it received when it last trained, kept in its
``context.state`` (one model copy per client, snapshotted for resume like every client
state). **Variant** ``official-code``: the server sends u, the difference between the
model it sends now and the one it sent the round before (the last global update; 0 in
round 1), and clients use ε = −ρ·u/‖u‖ over all weights (a global L2 norm, not the
authors' per-tensor scalar: their bug, fixed as FedSWA's code does). The two coincide
under full participation. ρ = ``sam-rho`` (0 means the authors' 0.1). The previous sent
model is checkpointed state.
"""

from __future__ import annotations

import numpy as np

from clients.options import one_of
from clients.protocol import FEDLESAM_UPDATE
from strategies.arrays import counter_mean, is_float, to_arrays, to_numpy, with_record
from strategies.cohort import COHORT
from strategies.methods import ImplementedIn, MethodSpec, TableRow
from strategies.methods.objective_server import ClientObjectiveFedAvg
from strategies.sam import SAM_RHO

FEDLESAM_DEFAULT_RHO = 0.1
FEDLESAM_VARIANTS = ("paper", "official-code")
FEDLESAM_WEIGHTINGS = ("uniform", "samples")


class FedLesam(ClientObjectiveFedAvg):
    """FedAvg whose clients take FedLESAM's step; the official-code variant also sends u."""

    def __init__(self, rho: float = FEDLESAM_DEFAULT_RHO, variant: str = "paper", weighting: str = "uniform", **kwargs):
        if weighting not in FEDLESAM_WEIGHTINGS:
            raise ValueError(f"weighting must be one of {FEDLESAM_WEIGHTINGS}, got {weighting!r}")
        if rho <= 0:
            raise ValueError(f"rho must be > 0, got {rho}")
        if variant not in FEDLESAM_VARIANTS:
            raise ValueError(f"variant must be one of {FEDLESAM_VARIANTS}, got {variant!r}")
        super().__init__("fedlesam", {"sam-rho": rho}, **kwargs)
        self.variant = variant
        self.weighting = weighting
        self.previous_sent: dict[str, np.ndarray] | None = None

    def configure_train(self, server_round, arrays, config, grid):
        messages = super().configure_train(server_round, arrays, config, grid)
        if self.variant == "paper":
            return messages
        sent = {key: value for key, value in to_numpy(arrays).items() if is_float(value)}
        previous = self.previous_sent or sent  # round 1: u = 0, no perturbation
        self.previous_sent = sent
        return with_record(messages, FEDLESAM_UPDATE, {key: sent[key] - previous[key] for key in sent})

    def aggregate_accepted(self, server_round, replies):
        # Under server-side DP the private mean (InPlaceFedAvg's hook) is uniform already.
        if self.weighting == "samples" or self.private_mean is not None:
            return super().aggregate_accepted(server_round, replies)
        contents = self.checked_contents(replies)  # Flower's checks and metric mean
        if not contents:
            return None, None
        models, _ = self.client_models(replies)
        mean = {
            key: (sum(m[key] for m in models) / len(models)).astype(value.dtype) if is_float(value)
            else counter_mean(models, key, value.dtype)
            for key, value in models[0].items()
        }
        return to_arrays(mean), self.train_metrics_aggr_fn(contents, self.weighted_by_key)

    def state_dict(self) -> dict:
        """The model sent last round (official-code variant; None otherwise and before round 1)."""
        return {"previous-sent": self.previous_sent}

    def load_state_dict(self, state: dict) -> None:
        self.previous_sent = state["previous-sent"]


METHODS = (
    MethodSpec(
        "fedlesam", "FedLESAM",
        lambda config: FedLesam(**COHORT, rho=config["sam-rho"] or FEDLESAM_DEFAULT_RHO,
                                variant=config["fedlesam-variant"], weighting=config["fedlesam-weighting"]),
        options={"sam-rho": SAM_RHO, "fedlesam-variant": one_of(*FEDLESAM_VARIANTS, default="paper"),
                 "fedlesam-weighting": one_of(*FEDLESAM_WEIGHTINGS, default="uniform")},
        objective=ImplementedIn("clients.objectives.fedlesam:fedlesam_objective"), objective_keys=("sam-rho",),
        client_state=True, dp_aggregate="mean", cost_table={"fedlesam": {}},
        smoke_runs={"fedlesam": {"participation": 1.0, "num-rounds": 2}},
        table_row=TableRow("FedLESAM (Fan et al., ICML 2024; the authors' code with FedSWA's fix of its norm): "
                           "each step's gradient at y + ε, ε = ρ·(θ^{τ_i} − θ^t)/‖θ^{τ_i} − θ^t‖ fixed for the "
                           'round, θ^{τ_i} the global model the client got when it last trained (client state; '
                           'plain SGD on its first round); FedAvg server with the uniform mean of the client '
                           "models (its authors' `server/server.py`; `fedlesam-weighting = samples`: "
                           'n_i-weighted); ρ = `sam-rho` (0: 0.1)',
                           '`fedlesam-variant = paper` (`official-code`: the server sends the last global update '
                           'u, ε = −ρ·u/‖u‖, no client state)'),
    ),
)
