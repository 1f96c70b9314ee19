"""A client's partition as device-resident tensors, built once per process."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from partitions import build_partitioner, load_dataset
from partitions.feasibility import partition_settings


@lru_cache(maxsize=8)
def partition_indices(dataset: str, data_dir: str, normalize: bool, settings: tuple) -> tuple[np.ndarray, ...]:
    """All clients' index arrays for a partition (cached: computed once per process);
    ``settings`` as :func:`partitions.feasibility.partition_settings` gives them. The labels
    come from the process's one cached copy of the data set (``normalize`` as the run's)."""
    labels = load_dataset(dataset, data_dir, normalize).y_train.numpy()
    return tuple(build_partitioner(*settings).assign(labels))


@lru_cache(maxsize=256)
def client_tensors(run_config_items: tuple, partition_id: int, num_partitions: int, device: str):
    """(x, y) of one partition on ``device``; cached so each process copies it once."""
    cfg = dict(run_config_items)
    data = load_dataset(cfg["dataset"], cfg["data-dir"], bool(cfg["normalize"]))
    settings = partition_settings({**cfg, "num-clients": num_partitions})
    indices = partition_indices(cfg["dataset"], cfg["data-dir"], bool(cfg["normalize"]), settings)[partition_id]
    index = torch.from_numpy(indices)
    return data.x_train[index].to(device), data.y_train[index].to(device)
