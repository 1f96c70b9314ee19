"""FedAvg with server-side update clipping — the worked example of a server-side method
(docs/extending.md).

The clipping step of DP-FedAvg (McMahan, Ramage, Talwar, Zhang, "Learning Differentially
Private Recurrent Language Models", ICLR 2018, Algorithm 1, ``ClipFn``), without its noise:
with Δ_i = w_i − w^t the update of client i and p_i = n_i / Σ_j n_j,

    Δ̃_i = Δ_i · min(1, C / ‖Δ_i‖)            (‖·‖ over every trained tensor of the model)
    w^{t+1} = w^t + Σ_i p_i · Δ̃_i

so no client moves the global model by more than C (run-config key ``fedavg-clip-norm``).
C = ∞ gives FedAvg. Counters (BatchNorm's ``num_batches_tracked``) are averaged, never
clipped. Updates are summed in partition order.
"""

from __future__ import annotations

import math

import numpy as np

from clients.options import Option
from strategies.arrays import is_float
from strategies.cohort import COHORT
from strategies.methods import MethodSpec, TableRow
from strategies.sampling import ServerUpdate
from strategies.weighted_mean import InPlaceFedAvg


def clipped_mean_update(
    global_w: dict[str, np.ndarray], client_ws: list[dict[str, np.ndarray]], num_examples: list[float], clip_norm: float
) -> dict[str, np.ndarray]:
    """w + Σ_i p_i · Δ_i · min(1, C/‖Δ_i‖)."""
    total = sum(num_examples)
    step = {key: np.zeros_like(w, dtype=np.float64) for key, w in global_w.items()}
    for client_w, n in zip(client_ws, num_examples):
        delta = {key: client_w[key].astype(np.float64) - w for key, w in global_w.items()}
        norm = math.sqrt(sum(float(np.sum(d * d)) for key, d in delta.items() if is_float(global_w[key])))
        scale = min(1.0, clip_norm / norm) if norm > 0 else 1.0
        for key, d in delta.items():
            step[key] += (n / total) * (scale if is_float(global_w[key]) else 1.0) * d
    return {key: (w + step[key]).astype(w.dtype) for key, w in global_w.items()}


class FedAvgClip(ServerUpdate, InPlaceFedAvg):
    """FedAvg of client updates clipped to norm ``clip_norm``, over a seeded cohort."""

    def __init__(self, clip_norm: float = 1.0, **kwargs):
        if not clip_norm > 0:
            raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
        super().__init__(**kwargs)
        self.clip_norm = clip_norm

    def server_update(self, models, metrics, replies):
        num_examples = [m[self.weighted_by_key] for m in metrics]
        return clipped_mean_update(self.sent_weights, models, num_examples, self.clip_norm)


METHODS = (
    MethodSpec(
        "fedavg-clip", "FedAvg+clip",
        lambda config: FedAvgClip(**COHORT, clip_norm=config["fedavg-clip-norm"]),
        options={"fedavg-clip-norm": Option(float, "a number > 0 (the largest norm of a client's update, C)",
                                            lambda v: v > 0, default=1.0)},
        table_row=TableRow('FedAvg with clipped updates (the clipping of DP-FedAvg, McMahan et al., ICLR 2018, '
                           'Algorithm 1, without noise): Δ̃_i = Δ_i·min(1, C/‖Δ_i‖), w ← w + Σ p_i Δ̃_i, C = '
                           '`fedavg-clip-norm` (1.0); the worked example of a server rule in '
                           '[extending.md](extending.md)',
                           '—'),
    ),
)
