"""FedGMA, server side (Tenison, Sreeramadas, Mugunthan, Oyallon, Rish, Belilovsky;
"Gradient Masked Averaging for Federated Learning", arXiv 2201.11986, 2022, TMLR 2023;
METHODS.md §2.2), with the AND-mask of Parascandolo et al. (ICLR 2021, "Learning
explanations that are hard to vary").

With Δ_i = w − w_i the update of client i in cohort S and p_i = n_i/Σ_j n_j:

    A = |(1/|S|)·Σ_i sign(Δ_i)|          (element-wise agreement of the update signs)
    mask = 1 where A ≥ ε, else 0          (AND-mask, ε = 0.8)
    w^{t+1} = w^t − η_s·(mask ⊙ Σ_i p_i·Δ_i)

Server lr η_s defaults to 1: GMA is a drop-in replacement for FedAvg's aggregation,
whose server step is 1, and mask ≡ 1 (ε = 0) then gives FedAvg exactly.

Flower has no FedGMA. Updates are summed in partition order; the class says how the
IMA authors' η = 1e-4 maps to η_s and where Basin's mask differs from other codes.
"""

from __future__ import annotations

import numpy as np

from clients.options import Option
from strategies.cohort import COHORT
from strategies.methods import MethodSpec, TableRow
from strategies.sampling import ServerUpdate
from strategies.weighted_mean import InPlaceFedAvg


def gma_mask(deltas: list[dict[str, np.ndarray]], threshold: float) -> dict[str, np.ndarray]:
    """1 where |mean_i sign(Δ_i)| ≥ threshold, else 0 (dtype of the updates)."""
    mask = {}
    for key, first in deltas[0].items():
        # Integer sign sums divided in float64: A is then the correctly rounded k/|S|, so
        # e.g. 8 of 10 agreeing (A = 0.8) passes ε = 0.8 instead of missing it by rounding.
        votes = sum(np.sign(d[key]).astype(np.int64) for d in deltas)
        agreement = np.abs(votes) / np.float64(len(deltas))
        mask[key] = (agreement >= threshold).astype(first.dtype)
    return mask


def fedgma_update(
    global_w: dict[str, np.ndarray],
    client_ws: list[dict[str, np.ndarray]],
    num_examples: list[int],
    threshold: float,
    server_lr: float,
) -> dict[str, np.ndarray]:
    """w − η_s·(mask ⊙ Σ p_i·(w − w_i))."""
    total = sum(num_examples)
    weights = [n / total for n in num_examples]
    deltas = [{key: w - cw[key] for key, w in global_w.items()} for cw in client_ws]
    mask = gma_mask(deltas, threshold)
    return {
        key: (w - server_lr * mask[key] * sum(p * d[key] for p, d in zip(weights, deltas))).astype(w.dtype)
        for key, w in global_w.items()
    }


class FedGMA(ServerUpdate, InPlaceFedAvg):
    """Gradient masked averaging over a seeded cohort.

    What the IMA authors' η = 1e-4 means (their utils/aggregator.py, ``agg_mode == 'gma'``):
    the new model is the FMA model w_FMA minus 1e-4·mask_i ⊙ (w_i − w)/|S| — and since the
    loop resets the model to w_FMA for every client, only the last client's term remains. So
    their "FedGMA" is the FMA up to a correction of relative size 1e-4: in effect FedAvg. The
    same number as Basin's η_s would scale the *whole* masked step and leave the model almost
    where it was. The IMA sweeps therefore run FedGMA with η_s = 1 (the masked FedAvg of the
    GMA paper); ``server-lr`` sets another value.

    Differences: the agreement is a plain count over clients (each client one vote, not
    weighted by n_i), and a coordinate a client left unchanged (sign 0) counts against
    agreement. The mask is the hard AND-mask: coordinates below ε are dropped. declearn's
    GradientMaskedAveraging, which implements and cites the GMA paper, uses a soft mask
    instead (1 where A ≥ ε, else A); that variant is not offered here.
    """

    def __init__(self, mask_threshold: float = 0.8, server_learning_rate: float = 1.0, **kwargs):
        if not 0.0 <= mask_threshold <= 1.0:
            raise ValueError(f"mask_threshold must be in [0, 1], got {mask_threshold}")
        super().__init__(**kwargs)
        self.mask_threshold = mask_threshold
        self.server_learning_rate = server_learning_rate

    def server_update(self, models, metrics, replies):
        num_examples = [m[self.weighted_by_key] for m in metrics]
        return fedgma_update(self.sent_weights, models, num_examples, self.mask_threshold, self.server_learning_rate)


METHODS: tuple[MethodSpec, ...] = (
    MethodSpec(
        "fedgma", "FedGMA",
        lambda config: FedGMA(**COHORT, mask_threshold=config["gma-threshold"],
                              server_learning_rate=METHODS[0].server_lr(config)),
        options={"gma-threshold": Option(float, "a number in (0, 1] (FedGMA's sign-agreement threshold ε)",
                                         lambda v: 0 < v <= 1, default=0.8)},
        smoke_runs={"fedgma+wima": {"averaging": "wima", "window": 2}},
        table_row=TableRow('FedGMA (Tenison et al.): AND-mask of update signs, ε = `gma-threshold` (0.8), w − '
                           'η_s·mask ⊙ Σ p_i Δ_i',
                           "η_s = `server-lr`, default 1 (the IMA code's 1e-4 scales a correction to the FMA "
                           'model, i.e. ≈ FedAvg; see the file)'),
    ),
)
