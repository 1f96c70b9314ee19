"""IID partition: a seeded shuffle cut into K nearly equal parts."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from partitions.base import LabelPartitioner


class IidPartitioner(LabelPartitioner):
    """Shuffle all samples with the seed and split them into K parts of equal size (±1).

    flwr-datasets' ``IidPartitioner`` cuts the dataset in storage order without
    shuffling, which is not IID when a dataset is stored sorted by label; hence this one.
    """

    def assign(self, labels: np.ndarray, columns: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        if len(labels) < self.num_partitions:
            raise ValueError(
                f"cannot split {len(labels)} samples into {self.num_partitions} non-empty partitions"
            )
        order = np.random.default_rng(self._seed).permutation(len(labels))
        return [np.sort(part) for part in np.array_split(order, self.num_partitions)]
