"""Pachinko allocation (Li & McCallum 2006) of CIFAR-100 over clients, as Reddi et al.
(Adaptive Federated Optimization, 2021, App. C.1) built the federated CIFAR-100 that WIMA
(500 clients × 100 samples) and IMA (100 clients) use.

Each client k gets n = N/K samples (``samples_per_client``). It draws a distribution over
the coarse labels, θ_k ~ Dir(α·1_C) (α = 0.1, C = 20), and for every coarse label c one
over its fine labels, φ_{k,c} ~ Dir(β·1_{F_c}) (β = 10, F_c = 5). Each of its n samples is
drawn by picking a coarse label c ~ θ_k, a fine label f ~ φ_{k,c}, then a sample of label f
uniformly among those no client has taken yet: sampling **without replacement**. When a
fine label runs out it is removed and φ_{k,c} renormalised over the fine labels left;
when every fine label of a coarse label has run out, the coarse label is removed and θ_k
renormalised (for this client and the ones after it). Clients are filled one after
another (Reddi et al.'s order), so every sample is used at most once and, with K·n = N,
exactly once.

Coarse labels are the ``coarse`` column (CIFAR-100's ``coarse_label``); the fine labels
each coarse label owns are read from the data.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from partitions.base import LabelPartitioner


class PachinkoPartitioner(LabelPartitioner):
    """Two-level Dirichlet (coarse, then fine labels) sampling without replacement.

    Parameters
    ----------
    num_partitions : int
        Number of clients K.
    samples_per_client : int | None
        n per client; None: ⌊N/K⌋.
    alpha : float
        Concentration of each client's coarse-label distribution (> 0; Reddi et al.: 0.1).
    beta : float
        Concentration of each client's fine-label distribution within a coarse label (> 0; 10).
    seed : int
        Seed of the draws.
    partition_by, coarse_by : str
        Fine and coarse label columns when used through flwr-datasets.
    """

    side_columns = {"coarse": "coarse_label"}

    def __init__(
        self, num_partitions: int, samples_per_client: int | None = None, alpha: float = 0.1, beta: float = 10.0,
        seed: int = 0, partition_by: str = "fine_label", coarse_by: str = "coarse_label",
    ):
        super().__init__(num_partitions, seed, partition_by)
        if not alpha > 0 or not beta > 0:
            raise ValueError(f"alpha and beta must be > 0, got alpha={alpha!r}, beta={beta!r}")
        if samples_per_client is not None and (not isinstance(samples_per_client, int) or samples_per_client < 1):
            raise ValueError(f"samples_per_client must be an integer >= 1 or None, got {samples_per_client!r}")
        self.samples_per_client = samples_per_client
        self.alpha, self.beta = alpha, beta
        self.side_columns = {"coarse": coarse_by}

    def assign(self, labels: np.ndarray, columns: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        fine = np.asarray(labels)
        coarse = self.required_column(columns, "coarse")
        n = self.samples_per_client or len(fine) // self.num_partitions
        if n * self.num_partitions > len(fine):
            raise ValueError(f"{self.num_partitions} clients × {n} samples need {n * self.num_partitions}, "
                             f"the data set has {len(fine)}")
        rng = np.random.default_rng(self._seed)
        coarse_labels = np.unique(coarse)
        fines_of = [np.unique(fine[coarse == c]) for c in coarse_labels]
        # Remaining samples per fine label, in a seeded random order: taking the next one is
        # drawing uniformly without replacement.
        remaining = {int(f): list(rng.permutation(np.flatnonzero(fine == f))) for f in np.unique(fine)}
        fine_left = [np.array([len(remaining[int(f)]) > 0 for f in fs]) for fs in fines_of]
        # Which coarse labels have a fine label left: changes only when a fine label runs out
        # (recomputed for every sample, it took half of a 50,000-sample partition's time).
        coarse_left = np.array([alive.any() for alive in fine_left])
        parts = []
        for _ in range(self.num_partitions):
            theta = rng.dirichlet(np.full(len(coarse_labels), self.alpha))
            phis = [rng.dirichlet(np.full(len(fs), self.beta)) for fs in fines_of]
            chosen = []
            for _ in range(n):
                c = _draw(rng, theta, coarse_left)
                j = _draw(rng, phis[c], fine_left[c])
                f = int(fines_of[c][j])
                chosen.append(remaining[f].pop())
                if not remaining[f]:
                    fine_left[c][j] = False
                    coarse_left[c] = fine_left[c].any()
            parts.append(np.sort(np.asarray(chosen, dtype=np.int64)))
        return parts


def _draw(rng: np.random.Generator, probabilities: np.ndarray, available: np.ndarray) -> int:
    """An index drawn from ``probabilities`` restricted to ``available`` and renormalised
    (uniform over what is available when the client put all its mass on exhausted labels)."""
    weights = np.where(available, probabilities, 0.0)
    total = weights.sum()
    if total <= 0:
        weights, total = available.astype(np.float64), float(available.sum())
    return int(rng.choice(len(weights), p=weights / total))
