"""A client's partition as device-resident tensors, built once per process."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from partitions import build_partitioner, load_dataset


@lru_cache(maxsize=8)
def partition_indices(
    dataset: str, data_dir: str, scheme: str, num_partitions: int, seed: int,
    alpha: float, classes_per_client: int, min_partition_size: int,
) -> tuple[np.ndarray, ...]:
    """All clients' index arrays for a partition (cached: computed once per process)."""
    labels = load_dataset(dataset, data_dir).y_train.numpy()
    partitioner = build_partitioner(scheme, num_partitions, seed, alpha, classes_per_client, min_partition_size)
    return tuple(partitioner.assign(labels))


@lru_cache(maxsize=256)
def client_tensors(run_config_items: tuple, partition_id: int, num_partitions: int, device: str):
    """(x, y) of one partition on ``device``; cached so each process copies it once."""
    cfg = dict(run_config_items)
    data = load_dataset(cfg["dataset"], cfg["data-dir"], bool(cfg["normalize"]))
    indices = partition_indices(
        cfg["dataset"], cfg["data-dir"], cfg["partition"], num_partitions, int(cfg["seed"]),
        float(cfg["alpha"]), int(cfg["classes-per-client"]), int(cfg["min-partition-size"]),
    )[partition_id]
    index = torch.from_numpy(indices)
    return data.x_train[index].to(device), data.y_train[index].to(device)
