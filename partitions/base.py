"""Common base of Basin's label-based partitioners.

Each scheme is a flwr-datasets ``Partitioner`` (so it plugs into
``flwr_datasets.FederatedDataset`` for hub datasets) whose arithmetic lives in one
method, :meth:`LabelPartitioner.assign`, that maps a label vector (and, for schemes that
need them, other per-sample columns: Pachinko's coarse labels, a domain, a writer id) to
per-client index arrays. Basin's own loaders hold data as tensors and call ``assign``
directly.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping

import numpy as np
from flwr_datasets.partitioner import Partitioner


class LabelPartitioner(Partitioner):
    """A seeded partitioner that splits a dataset by its label column.

    Parameters
    ----------
    num_partitions : int
        Number of clients K.
    seed : int
        Seed of the partition's random generator; equal seeds give equal partitions.
    partition_by : str
        Name of the label column when used through flwr-datasets.
    """

    # The other columns ``assign`` reads: {name in ``columns``: dataset column (flwr-datasets)}.
    side_columns: dict[str, str] = {}

    def __init__(self, num_partitions: int, seed: int = 0, partition_by: str = "label"):
        super().__init__()
        if not isinstance(num_partitions, int) or num_partitions < 1:
            raise ValueError(f"num_partitions must be an integer >= 1, got {num_partitions!r}")
        self._num_partitions = num_partitions
        self._seed = seed
        self._partition_by = partition_by
        self._indices: list[np.ndarray] | None = None

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    @abstractmethod
    def assign(self, labels: np.ndarray, columns: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        """Return, for each client, the sorted indices of its samples (``columns``: the
        :attr:`side_columns` the scheme needs, by name)."""

    def required_column(self, columns: Mapping[str, np.ndarray] | None, name: str) -> np.ndarray:
        """``columns[name]``, or a ValueError saying that this scheme needs it."""
        if not columns or name not in columns:
            raise ValueError(f"{type(self).__name__} needs the data set's {name!r} column, which it does not have")
        return np.asarray(columns[name])

    def load_partition(self, partition_id: int):
        if self._indices is None:
            labels = np.asarray(self.dataset[self._partition_by])
            columns = {name: np.asarray(self.dataset[column]) for name, column in self.side_columns.items()}
            self._indices = self.assign(labels, columns)
        return self.dataset.select(self._indices[partition_id].tolist())

