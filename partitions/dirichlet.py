"""Dirichlet label-skew partition (Yurochkin et al. 2019; Hsu et al. 2019).

METHODS.md §3: for each class c draw client proportions p_c ~ Dir(α·1_K) and split the
samples of class c accordingly; redraw everything until every client holds at least
``min_partition_size`` samples. α = 0 is the limit in which each client sees a single
class: client i gets class (i mod C), and each class is split equally among its clients.

``balance=True`` adds the rule of NIID-Bench (Li et al., ICDE 2022) and of FedLab's
``hetero_dir_partition`` ("noniid-labeldir"), which the IMA authors' code uses: classes
are dealt in order, and a client that already holds ≥ N/K samples gets proportion 0 for
the next class (the others' proportions renormalised). Without it, heavy-tailed draws at
small α give a few clients most of the data.

The draws are the same as one class after another, draw after draw (numpy's
``Generator.dirichlet`` with ``size`` draws row by row), but they are made ``batch_draws``
at a time and only the sizes are computed until a draw passes: the IMA setting
Dir(0.05) over 100 Fashion-MNIST clients with at least 10 samples each passes about once
in 8 000 draws (measured: 72 in 602 000 with balance), which takes about a second here.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from partitions.base import LabelPartitioner


class DirichletPartitioner(LabelPartitioner):
    """Label skew with concentration ``alpha`` (smaller is more heterogeneous).

    Parameters
    ----------
    num_partitions : int
        Number of clients K.
    alpha : float
        Dirichlet concentration, >= 0; 0 means one class per client.
    min_partition_size : int
        Redraw until every client has at least this many samples.
    balance : bool
        NIID-Bench's rule: a client holding ≥ N/K samples gets no share of later classes.
    max_redraws : int
        Give up with a clear error after this many draws.
    batch_draws : int
        Draws made at once (a speed setting; the result does not depend on it).
    seed, partition_by : see :class:`LabelPartitioner`.
    """

    def __init__(
        self,
        num_partitions: int,
        alpha: float,
        min_partition_size: int = 10,
        balance: bool = False,
        max_redraws: int = 200_000,
        batch_draws: int = 1000,
        seed: int = 0,
        partition_by: str = "label",
    ):
        super().__init__(num_partitions, seed, partition_by)
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if min_partition_size < 0:
            raise ValueError(f"min_partition_size must be >= 0, got {min_partition_size}")
        if max_redraws < 1 or batch_draws < 1:
            raise ValueError(f"max_redraws and batch_draws must be >= 1, got {max_redraws}, {batch_draws}")
        self.alpha = float(alpha)
        self.min_partition_size = min_partition_size
        self.balance = balance
        self.max_redraws = max_redraws
        self.batch_draws = batch_draws

    def assign(self, labels: np.ndarray, columns: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        rng = np.random.default_rng(self._seed)
        classes = np.unique(labels)
        by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
        if self.alpha == 0:
            return self._one_class_per_client(by_class)
        class_sizes = np.array([len(idx) for idx in by_class])
        if class_sizes.sum() < self.num_partitions * self.min_partition_size:
            raise ValueError(
                f"{class_sizes.sum()} samples cannot give each of {self.num_partitions} clients "
                f"{self.min_partition_size}; lower min-partition-size or use fewer clients"
            )
        drawn = 0
        while drawn < self.max_redraws:
            batch = min(self.batch_draws, self.max_redraws - drawn)
            proportions = rng.dirichlet(np.full(self.num_partitions, self.alpha), size=(batch, len(classes)))
            counts = self._split_counts(proportions, class_sizes)  # (batch, classes, clients)
            passed = np.flatnonzero(counts.sum(axis=1).min(axis=1) >= self.min_partition_size)
            if len(passed):
                first = counts[passed[0]]
                parts = [
                    np.split(idx, np.cumsum(first[c])[:-1]) for c, idx in enumerate(by_class)
                ]
                return [np.sort(np.concatenate([parts[c][k] for c in range(len(by_class))]))
                        for k in range(self.num_partitions)]
            drawn += batch
        raise ValueError(
            f"Dirichlet(alpha={self.alpha}) gave some of the {self.num_partitions} clients fewer than "
            f"{self.min_partition_size} samples in {self.max_redraws} draws"
            f"{' (with the balance rule)' if self.balance else ''}; lower min-partition-size, raise alpha, "
            "use fewer clients" + ("" if self.balance else " or set dirichlet-balance = true")
        )

    def _split_counts(self, proportions: np.ndarray, class_sizes: np.ndarray) -> np.ndarray:
        """Samples of each class per client for each draw, as the cut points
        ⌊cumsum(p)·n_c⌋ of a sequential split give them (the last client takes the rest)."""
        batch, num_classes, num_clients = proportions.shape
        held = np.zeros((batch, num_clients), dtype=np.int64)
        counts = np.empty((batch, num_classes, num_clients), dtype=np.int64)
        cap = class_sizes.sum() / num_clients
        for c in range(num_classes):
            p = proportions[:, c]
            if self.balance:
                p = p * (held < cap)
                p = p / p.sum(axis=1, keepdims=True)
            cuts = (np.cumsum(p, axis=1) * class_sizes[c]).astype(np.int64)
            cuts[:, -1] = class_sizes[c]
            counts[:, c] = np.diff(cuts, prepend=0, axis=1)
            held += counts[:, c]
        return counts

    def _one_class_per_client(self, by_class: list[np.ndarray]) -> list[np.ndarray]:
        num_classes = len(by_class)
        owners = [list(range(c, self.num_partitions, num_classes)) for c in range(num_classes)]
        parts: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * self.num_partitions
        for idx, clients in zip(by_class, owners):
            for client, chunk in zip(clients, np.array_split(idx, max(len(clients), 1))):
                parts[client] = np.sort(chunk)
        sizes = [len(p) for p in parts]
        if min(sizes) < max(self.min_partition_size, 1):
            raise ValueError(
                f"alpha=0 with {self.num_partitions} clients and {num_classes} classes leaves "
                f"a client with {min(sizes)} samples (minimum {self.min_partition_size})"
            )
        return parts
