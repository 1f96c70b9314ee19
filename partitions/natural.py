"""Natural partitions: one client per writer (FEMNIST), per speaking role (Shakespeare), …

The grouping is flwr-datasets' ``NaturalIdPartitioner`` (partition ids in sorted order of
the natural ids). Data sets have more ids than the papers use (WIMA: 3,400 FEMNIST
writers, 715 Shakespeare roles), so Basin keeps the K ids with the most training samples
(ties: the smaller id), K = ``num_partitions``; samples of the other ids are left out.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from partitions.base import LabelPartitioner


class NaturalPartitioner(LabelPartitioner):
    """The K largest natural groups of the ``natural-id`` column, one per client."""

    def __init__(self, num_partitions: int, seed: int = 0, partition_by: str = "label", id_by: str = "writer_id"):
        super().__init__(num_partitions, seed, partition_by)
        self.side_columns = {"natural-id": id_by}

    def assign(self, labels: np.ndarray, columns: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        from datasets import Dataset
        from flwr_datasets.partitioner import NaturalIdPartitioner

        ids = self.required_column(columns, "natural-id")
        unique, counts = np.unique(ids, return_counts=True)
        if len(unique) < self.num_partitions:
            raise ValueError(f"num-clients = {self.num_partitions} but the data set has {len(unique)} natural ids")
        order = np.lexsort((unique, -counts))  # most samples first, then the smaller id
        kept = np.isin(ids, unique[order[: self.num_partitions]])
        table = Dataset.from_dict({"natural-id": ids[kept].tolist(), "index": np.flatnonzero(kept).tolist()})
        natural = NaturalIdPartitioner(partition_by="natural-id")
        natural.dataset = table
        return [np.sort(np.asarray(natural.load_partition(p)["index"], dtype=np.int64)) for p in range(self.num_partitions)]
