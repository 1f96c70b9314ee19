"""#C = k class shards (McMahan et al. 2017), METHODS.md §3.

Sort the samples by label, cut them into K·k shards of equal size and give each client
k shards drawn at random without replacement; every client gets the same number of
samples. flwr-datasets' ``ShardPartitioner`` re-sorts the dataset it returns partitions
of, so its indices do not refer to the caller's tensors; hence this one.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from partitions.base import LabelPartitioner


class ShardPartitioner(LabelPartitioner):
    """Each client receives ``shards_per_client`` label-sorted shards of equal size."""

    def __init__(self, num_partitions: int, shards_per_client: int, seed: int = 0, partition_by: str = "label"):
        super().__init__(num_partitions, seed, partition_by)
        if not isinstance(shards_per_client, int) or shards_per_client < 1:
            raise ValueError(f"shards_per_client must be an integer >= 1, got {shards_per_client!r}")
        self.shards_per_client = shards_per_client

    def assign(self, labels: np.ndarray, columns: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        rng = np.random.default_rng(self._seed)
        num_shards = self.num_partitions * self.shards_per_client
        shard_size = len(labels) // num_shards
        if shard_size == 0:
            raise ValueError(f"{len(labels)} samples are too few for {num_shards} shards")
        # A stable sort of a seeded permutation: ties between equal labels are random.
        order = rng.permutation(len(labels))
        order = order[np.argsort(labels[order], kind="stable")][: num_shards * shard_size]
        shards = order.reshape(num_shards, shard_size)
        shard_ids = rng.permutation(num_shards).reshape(self.num_partitions, self.shards_per_client)
        return [np.sort(shards[ids].ravel()) for ids in shard_ids]
