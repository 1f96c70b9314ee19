"""Client-wise Dirichlet label skew (Hsu, Qi, Brown 2019), the partition of WIMA and FedSWA.

Each client k draws its class mix q_k ~ Dir(a) and receives n samples (default ⌊N/K⌋,
so every client has the same size), each of a class drawn from q_k, taken uniformly
among the samples of that class that are left. Two conventions for the concentration a:

- ``concentration="class-prior"`` (Hsu et al. as written, WIMA's [14]): a = α·p with p the
  class prior (the classes' shares of the training set); on a balanced set this is
  Dir((α/C)·1_C), so the whole vector sums to α;
- ``concentration="uniform"`` (the FedSWA authors' ``dirichlet_data.py:
  data_from_dirichlet``): a = α·1_C, each class α, a C times larger concentration for the
  same α.

When a class has no sample left (``exhaustion``):

- ``"drop"``: the class is removed and q_k renormalised over the classes left, for this
  client and the ones after it (as Pachinko allocation does), so no sample is used twice;
  needs n·K ≤ N;
- ``"refill"`` (the FedSWA code): the class's pool is reshuffled and drawn again, so
  samples are reused (within a client too), and n·K may exceed N.

α = 0 is the limit in which a client's mix is one class: client k's class is (k mod C).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from partitions.base import LabelPartitioner

CONCENTRATIONS = ("class-prior", "uniform")
EXHAUSTIONS = ("drop", "refill")


class ClientDirichletPartitioner(LabelPartitioner):
    """Equal-size clients, each with a Dirichlet mix of classes.

    Clients are filled one after another in id order. The draws use one seeded generator: a
    client's n class labels are one multinomial draw from q_k (the same law as n draws one
    sample at a time); with ``"drop"``, the draws of an exhausted class beyond what it had
    left are drawn again from q_k renormalised over the classes left, which is the law of
    sample-at-a-time drawing with removal.

    Parameters
    ----------
    num_partitions : int
        Number of clients K.
    alpha : float
        Dirichlet concentration α >= 0 (0: one class per client).
    samples_per_client : int | None
        n per client; None: ⌊N/K⌋.
    concentration : str
        'class-prior' (Dir(α·p), Hsu et al.) or 'uniform' (Dir(α·1_C), FedSWA's code).
    exhaustion : str
        'drop' (renormalise over the classes left, no reuse) or 'refill' (reuse, FedSWA's code).
    seed, partition_by : see :class:`LabelPartitioner`.
    """

    def __init__(
        self,
        num_partitions: int,
        alpha: float,
        samples_per_client: int | None = None,
        concentration: str = "class-prior",
        exhaustion: str = "drop",
        seed: int = 0,
        partition_by: str = "label",
    ):
        super().__init__(num_partitions, seed, partition_by)
        if not alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {alpha!r}")
        if samples_per_client is not None and (not isinstance(samples_per_client, int) or samples_per_client < 1):
            raise ValueError(f"samples_per_client must be an integer >= 1 or None, got {samples_per_client!r}")
        if concentration not in CONCENTRATIONS:
            raise ValueError(f"concentration must be one of {CONCENTRATIONS}, got {concentration!r}")
        if exhaustion not in EXHAUSTIONS:
            raise ValueError(f"exhaustion must be one of {EXHAUSTIONS}, got {exhaustion!r}")
        self.alpha = float(alpha)
        self.samples_per_client = samples_per_client
        self.concentration = concentration
        self.exhaustion = exhaustion

    def class_mixes(self, rng: np.random.Generator, class_sizes: np.ndarray) -> np.ndarray:
        """q_k for every client, shape (K, C)."""
        num_classes = len(class_sizes)
        if self.alpha == 0:
            return np.eye(num_classes)[np.arange(self.num_partitions) % num_classes]
        prior = class_sizes / class_sizes.sum() if self.concentration == "class-prior" else np.ones(num_classes)
        return rng.dirichlet(self.alpha * prior, size=self.num_partitions)

    def assign(self, labels: np.ndarray, columns: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        labels = np.asarray(labels)
        rng = np.random.default_rng(self._seed)
        classes = np.unique(labels)
        pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
        class_sizes = np.array([len(pool) for pool in pools], dtype=np.float64)
        n = self.samples_per_client or len(labels) // self.num_partitions
        if n < 1:
            raise ValueError(f"{len(labels)} samples cannot give each of {self.num_partitions} clients one")
        if self.exhaustion == "drop" and n * self.num_partitions > len(labels):
            raise ValueError(
                f"{self.num_partitions} clients × {n} samples need {n * self.num_partitions}, the data set has "
                f"{len(labels)}; lower samples-per-client or reuse samples (exhaustion 'refill')"
            )
        mixes = self.class_mixes(rng, class_sizes)
        taken = np.zeros(len(classes), dtype=np.int64)  # next unused position in each pool
        parts = []
        for mix in mixes:
            chosen = []
            if self.exhaustion == "refill":
                for c, count in enumerate(rng.multinomial(n, mix)):
                    while count:  # the next `count` of the class, in slices (10⁶ clients: no loop per sample)
                        if taken[c] == len(pools[c]):  # FedSWA: reshuffle the class and start again
                            pools[c], taken[c] = rng.permutation(pools[c]), 0
                        step = min(count, len(pools[c]) - taken[c])
                        chosen.append(pools[c][taken[c]:taken[c] + step])
                        taken[c] += step
                        count -= step
            else:
                needed = n
                while needed:
                    left = np.array([len(pool) for pool in pools]) - taken
                    weights = np.where(left > 0, mix, 0.0)
                    if weights.sum() <= 0:  # all its mass on exhausted classes: uniform over the rest
                        weights = (left > 0).astype(np.float64)
                    counts = np.minimum(rng.multinomial(needed, weights / weights.sum()), left)
                    for c in map(int, np.flatnonzero(counts)):
                        chosen.append(pools[c][taken[c]:taken[c] + counts[c]])
                        taken[c] += counts[c]
                    needed -= int(counts.sum())
            parts.append(np.sort(np.concatenate(chosen).astype(np.int64, copy=False)) if chosen
                         else np.zeros(0, dtype=np.int64))
        return parts
