"""Dirichlet label-skew partition (Yurochkin et al. 2019; Hsu et al. 2019).

METHODS.md §3: for each class c draw client proportions p_c ~ Dir(α·1_K) and split the
samples of class c accordingly; redraw everything until every client holds at least
``min_partition_size`` samples. α = 0 is the limit in which each client sees a single
class: client i gets class (i mod C), and each class is split equally among its clients.
"""

from __future__ import annotations

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
    max_redraws : int
        Give up with a clear error after this many draws.
    seed, partition_by : see :class:`LabelPartitioner`.
    """

    def __init__(
        self,
        num_partitions: int,
        alpha: float,
        min_partition_size: int = 10,
        max_redraws: int = 1000,
        seed: int = 0,
        partition_by: str = "label",
    ):
        super().__init__(num_partitions, seed, partition_by)
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if min_partition_size < 0:
            raise ValueError(f"min_partition_size must be >= 0, got {min_partition_size}")
        self.alpha = float(alpha)
        self.min_partition_size = min_partition_size
        self.max_redraws = max_redraws

    def assign(self, labels: np.ndarray) -> list[np.ndarray]:
        rng = np.random.default_rng(self._seed)
        classes = np.unique(labels)
        by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
        if self.alpha == 0:
            return self._one_class_per_client(by_class)
        num_clients = self.num_partitions
        for _ in range(self.max_redraws):
            parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
            for idx in by_class:
                proportions = rng.dirichlet(np.full(num_clients, self.alpha))
                cuts = (np.cumsum(proportions)[:-1] * len(idx)).astype(int)
                for client, chunk in enumerate(np.split(idx, cuts)):
                    parts[client].append(chunk)
            sizes = [sum(len(c) for c in p) for p in parts]
            if min(sizes) >= self.min_partition_size:
                return [np.sort(np.concatenate(p)) for p in parts]
        raise ValueError(
            f"Dirichlet(alpha={self.alpha}) gave some client fewer than "
            f"{self.min_partition_size} samples in {self.max_redraws} draws; lower "
            "min-partition-size, raise alpha or use fewer clients"
        )

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
