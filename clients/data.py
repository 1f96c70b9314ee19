"""A client's partition as device-resident tensors, built once per process."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch

from clients.memory_format import in_layout
from partitions.cache import cached_partition
from partitions.datasets import channel_statistics, load_dataset
from partitions.feasibility import partition_settings


@lru_cache(maxsize=8)
def partition_indices(dataset: str, data_dir: str, normalize: bool, settings: tuple) -> Sequence[np.ndarray]:
    """All clients' index arrays for a partition, ``settings`` as
    :func:`partitions.feasibility.partition_settings` gives them; cached in the process and
    on disk (partitions/cache.py: the launcher's check or the first process of a run builds
    it, the others load it). The labels come from the process's one cached copy of the data set."""
    data = load_dataset(dataset, data_dir, normalize)

    def build() -> list[np.ndarray]:
        from partitions.stats import build_partitioner  # flwr-datasets: only when building

        return build_partitioner(*settings).assign(partition_labels_of(data), data.columns)

    if not data.fingerprint:  # content unknown: nothing to key a disk entry by
        return tuple(build())
    return cached_partition(data.fingerprint, settings, build)


def partition_labels_of(data) -> np.ndarray:
    """The label per training sample that label schemes split by: the class, or for a
    next-character set the snippet's last target (its next character)."""
    labels = data.y_train.numpy()
    return labels if labels.ndim == 1 else last_targets(labels)


def last_targets(targets: np.ndarray) -> np.ndarray:
    """Each row's last scored target (padding is IGNORE_INDEX, below every id)."""
    scored = targets >= 0
    last = scored.shape[1] - 1 - np.argmax(scored[:, ::-1], axis=1)
    return targets[np.arange(len(targets)), last]


# The stream of seeded draws that picks a client's held-out split (client-evaluation): its own,
# so the split never moves another draw of the run.
HELD_OUT_STREAM = 7


@lru_cache(maxsize=256)
def client_tensors(run_config_items: tuple, partition_id: int, num_partitions: int, device: str,
                   layout: torch.memory_format = torch.contiguous_format):
    """(x, y, x_held_out, y_held_out) of one partition on ``device``, images in ``layout``
    (the model's: clients/memory_format.py); cached so each process copies it once. With
    ``client-evaluation`` = f > 0 a seeded fraction f of the partition (at least one sample,
    never all) is held out for evaluating the received model and the client trains on the
    rest; with f = 0 (the default) nothing is held out."""
    cfg = dict(run_config_items)
    data = load_dataset(cfg["dataset"], cfg["data-dir"], bool(cfg["normalize"]))
    settings = partition_settings({**cfg, "num-clients": num_partitions})
    indices = np.array(partition_indices(cfg["dataset"], cfg["data-dir"], bool(cfg["normalize"]), settings)[partition_id])
    index = torch.from_numpy(indices)  # a copy: the cached partition is a read-only mapped view
    x, y = data.x_train[index], data.y_train[index]
    fraction = float(cfg.get("client-evaluation", 0.0))
    if fraction > 0 and cfg.get("client-evaluation-split", "hold-out") == "test-slice":  # nothing taken from training
        sliced = torch.from_numpy(partition_test_slices(cfg["dataset"], cfg["data-dir"], bool(cfg["normalize"]),
                                                        settings, fraction, int(cfg["seed"]))[partition_id])
        return (in_layout(x.to(device), layout), y.to(device), in_layout(data.x_test[sliced].to(device), layout),
                data.y_test[sliced].to(device))
    split = held_out_split(len(indices), fraction, int(cfg["seed"]), partition_id)
    if split is None:
        return in_layout(x.to(device), layout), y.to(device), x[:0].to(device), y[:0].to(device)
    train, test = split
    return (in_layout(x[train].to(device), layout), y[train].to(device), in_layout(x[test].to(device), layout),
            y[test].to(device))


@lru_cache(maxsize=2)
def partition_test_slices(dataset: str, data_dir: str, normalize: bool, settings: tuple, fraction: float,
                          seed: int) -> list[np.ndarray]:
    """Every client's slice of the test split (partitions/test_slices.py), once per process:
    :func:`held_out_count` of its examples, by its label proportions."""
    from partitions.test_slices import test_slices

    data = load_dataset(dataset, data_dir, normalize)
    labels = partition_labels_of(data)
    test_labels = data.y_test.numpy()
    test_labels = test_labels if test_labels.ndim == 1 else last_targets(test_labels)
    members = partition_indices(dataset, data_dir, normalize, settings)
    return test_slices([labels[m] for m in members], test_labels, [held_out_count(len(m), fraction) for m in members],
                       seed, data.num_classes)


@lru_cache(maxsize=4)
def node_tensors(path: str, run_config_items: tuple, partition_id: int, device: str,
                 layout: torch.memory_format = torch.contiguous_format) -> tuple[tuple[torch.Tensor, ...], int]:
    """((x, y, x_held_out, y_held_out), number of classes) of a node's own data at ``path``
    (partitions/node_data.py), as :func:`client_tensors` makes them of a partition: images
    scaled by the data's largest pixel value and, with ``normalize``, standardised by the
    federation's per-channel mean and std its basin-node.json records (else the node's own
    training split's); with ``client-evaluation`` = f > 0 the held-out split is the data's own
    test split where it has one, else the same seeded fraction f of its training examples.
    The number of classes is basin-node.json's, else the run's data set's."""
    from partitions.node_data import load_node_data

    cfg = dict(run_config_items)
    node = load_node_data(path)
    num_classes = int(node.described["num-classes"]) if "num-classes" in node.described else \
        load_dataset(cfg["dataset"], cfg["data-dir"], bool(cfg["normalize"])).num_classes
    node.check_fits(num_classes, None)

    def inputs(array: np.ndarray) -> torch.Tensor:
        if node.is_text:
            return torch.from_numpy(array)
        return torch.tensor(array, dtype=torch.float32).div_(float(node.max_value))  # as partitions/tensor_dataset.py

    x, y = inputs(node.x_train), torch.from_numpy(node.y_train)
    x_test = inputs(node.x_test) if node.x_test is not None else None
    if bool(cfg["normalize"]) and not node.is_text:
        mean, std = channel_statistics(x)  # the node's own, where its folder records no federation's
        if "mean" in node.described:
            mean = torch.tensor(node.described["mean"], dtype=torch.float32).reshape(1, -1, 1, 1)
            std = torch.tensor(node.described["std"], dtype=torch.float32).reshape(1, -1, 1, 1)
        x = x.sub_(mean).div_(std)
        x_test = x_test.sub_(mean).div_(std) if x_test is not None else None
    fraction = float(cfg.get("client-evaluation", 0.0))
    if fraction > 0 and x_test is not None and node.y_test is not None:
        held = (x_test, torch.from_numpy(node.y_test))
    elif (split := held_out_split(len(y), fraction, int(cfg["seed"]), partition_id)) is not None:
        train, test = split
        x, y, held = x[train], y[train], (x[test], y[test])
    else:
        held = (x[:0], y[:0])
    return ((in_layout(x.to(device), layout), y.to(device), in_layout(held[0].to(device), layout), held[1].to(device)),
            num_classes)


def held_out_split(samples: int, fraction: float, seed: int, partition_id: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(training, held-out) indices of a client's ``samples`` examples, both sorted: a seeded
    :func:`held_out_count` of them held out (its own stream of draws); None when none is."""
    held_out = held_out_count(samples, fraction)
    if not held_out:
        return None
    order = np.random.default_rng([seed, partition_id, HELD_OUT_STREAM]).permutation(samples)
    return torch.from_numpy(np.sort(order[held_out:])), torch.from_numpy(np.sort(order[:held_out]))


def held_out_count(samples: int, fraction: float) -> int:
    """How many of a client's ``samples`` it holds out: round(fraction · n), at least one and
    at most n − 1 when fraction > 0, none when it is 0."""
    if fraction <= 0 or samples < 2:
        return 0
    return min(samples - 1, max(1, round(fraction * samples)))
