"""Common base of Basin's label-based partitioners.

Each scheme is a flwr-datasets ``Partitioner`` (so it plugs into
``flwr_datasets.FederatedDataset`` for hub datasets) whose arithmetic lives in one
method, :meth:`LabelPartitioner.assign`, that maps a label vector (and, for schemes that
need them, other per-sample columns: Pachinko's coarse labels, a domain, a writer id) to
per-client index arrays. Basin's own loaders hold data as tensors and call ``assign``
directly.

``LabelPartitioner`` implements flwr-datasets' ``Partitioner`` interface itself and is
registered as its virtual subclass instead of inheriting from it: importing
``flwr_datasets`` loads Hugging Face ``datasets``, seaborn and SciPy (3–4 s on 2 CPU
cores), which the launcher, the ServerApp and the client processes would otherwise pay
for nothing on every run. It is registered when ``partitions.base`` is imported after
``flwr_datasets``, and else when the first partitioner is built after it: import
``flwr_datasets`` before building a partitioner that you give to ``FederatedDataset``.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np


def register_with_flwr_datasets() -> None:
    """Make LabelPartitioner a virtual subclass of flwr-datasets' ``Partitioner`` (what
    ``FederatedDataset`` checks), if flwr-datasets is already imported; idempotent."""
    module = sys.modules.get("flwr_datasets.partitioner")
    if module is not None and not issubclass(LabelPartitioner, module.Partitioner):
        module.Partitioner.register(LabelPartitioner)


class LabelPartitioner(ABC):
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
        register_with_flwr_datasets()
        self._dataset: Any = None
        if not isinstance(num_partitions, int) or num_partitions < 1:
            raise ValueError(f"num_partitions must be an integer >= 1, got {num_partitions!r}")
        self._num_partitions = num_partitions
        self._seed = seed
        self._partition_by = partition_by
        self._indices: list[np.ndarray] | None = None

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    # flwr-datasets' Partitioner interface, with its checks and messages.
    @property
    def dataset(self) -> Any:
        """The Hugging Face ``datasets.Dataset`` to partition (set once)."""
        if self._dataset is None:
            raise AttributeError("The dataset field should be set before using it (directly, via `load_partition` "
                                 "or some other method).")
        return self._dataset

    @dataset.setter
    def dataset(self, value: Any) -> None:
        from datasets import Dataset

        if self._dataset is not None:
            raise ValueError("The dataset should be assigned only once to the partitioner.")
        if not isinstance(value, Dataset):
            raise TypeError(f"The dataset object you want to assign to the partitioner should be of type "
                            f"`datasets.Dataset` but given {type(value)}.")
        self._dataset = value

    def is_dataset_assigned(self) -> bool:
        """Whether a dataset has been assigned."""
        return self._dataset is not None

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


register_with_flwr_datasets()
