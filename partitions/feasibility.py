"""Whether a run config's partition can be built, checked before Flower starts.

A partition that cannot be built (Dirichlet draws that never give every client its
minimum, more shards than samples, a class count the scheme cannot serve) would
otherwise fail inside every client process after Flower and Ray have started. The
launcher and the sweep validation build it here first, on the data set's real labels
where they are on this machine (digits; Fashion-MNIST's label file), and otherwise on
synthetic labels with the data set's class counts (CIFAR-10: 10 × 5 000; CIFAR-100:
100 × 500, 5 fine labels per coarse one; Fashion-MNIST without its files: 10 × 6 000).
Hub sets of other names are not checked (their class counts are not known before loading
them). Schemes that need other columns (Pachinko's coarse labels, natural ids, domains)
are refused at once on a built-in set that lacks them.

A partition built on a set's real labels is the run's own: it is kept in the disk cache
(partitions/cache.py), where the ServerApp and the client processes find it, and a
partition found there is feasible without building it again (nor importing flwr-datasets).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from partitions.cache import cached_partition, partition_sizes
from partitions.datasets import FASHION_MNIST_DEFAULT_DIR, digits_labels, local_fingerprint, read_idx

# Training-split class counts of the built-in sets: (classes, samples per class).
CLASS_COUNTS = {"fashion-mnist": (10, 6000), "cifar10": (10, 5000), "cifar100": (100, 500)}


def partition_labels(dataset: str, data_dir: str) -> np.ndarray | None:
    """The training labels to partition: real where local, synthetic with the right class
    counts otherwise, None when unknown."""
    if dataset == "digits":
        return digits_labels()
    if dataset == "fashion-mnist":
        directory = Path(data_dir) if data_dir else FASHION_MNIST_DEFAULT_DIR
        for name in ("train-labels-idx1-ubyte", "train-labels-idx1-ubyte.gz"):
            if (directory / name).is_file():
                return read_idx(directory / name).astype(np.int64)
    if dataset in CLASS_COUNTS:
        classes, per_class = CLASS_COUNTS[dataset]
        return np.repeat(np.arange(classes), per_class)
    return None


def partition_settings(config: Mapping[str, Any]) -> tuple:
    """The run-config values a partition depends on, in :func:`build_partitioner`'s argument
    order: (scheme, K, seed, alpha, classes-per-client, min size, balance, Pachinko α, β,
    clients per domain, client-wise Dirichlet concentration, exhaustion, samples per client)."""
    return (
        str(config["partition"]), int(config["num-clients"]), int(config["seed"]), float(config["alpha"]),
        int(config["classes-per-client"]), int(config["min-partition-size"]), bool(config["dirichlet-balance"]),
        float(config["pachinko-alpha"]), float(config["pachinko-beta"]), int(config["clients-per-domain"]),
        str(config["client-dirichlet-concentration"]), str(config["client-dirichlet-exhaustion"]),
        int(config["samples-per-client"]),
    )


def check_no_empty_clients(indices: Sequence[np.ndarray]) -> None:
    """ValueError naming how many clients a partition leaves without samples: an empty
    client has nothing to train on and no weight in any mean, so a run refuses it."""
    empty = np.flatnonzero(partition_sizes(indices) == 0).tolist()
    if empty:
        shown = ", ".join(map(str, empty[:10])) + (", …" if len(empty) > 10 else "")
        raise ValueError(
            f"{len(empty)} of {len(indices)} clients would hold no samples (partitions {shown}); "
            "set min-partition-size >= 1, raise alpha, or use fewer clients"
        )


def check_partition(config: Mapping[str, Any]) -> None:
    """Raise ValueError naming the setting when the config's partition cannot be built."""
    _check(str(config["dataset"]), str(config["data-dir"]), partition_settings(config))


@lru_cache(maxsize=64)
def _check(dataset: str, data_dir: str, settings: tuple) -> None:
    labels = partition_labels(dataset, data_dir)
    if labels is None:
        return
    scheme, num_clients, seed, alpha, classes_per_client, min_size, balance, _, _, clients_per_domain = settings[:10]
    needs = "coarse labels" if scheme == "pachinko" else "natural ids (writer, role)" if scheme == "natural" else \
        "a domain column" if clients_per_domain else None
    columns = {"coarse": labels // 5} if dataset == "cifar100" else {}  # CIFAR-100: 5 fine labels per coarse one
    if needs and not (scheme == "pachinko" and columns):
        raise ValueError(
            f"partition = {scheme!r}{' with clients-per-domain > 0' if clients_per_domain else ''} needs {needs}; "
            f"{dataset} has none; allowed: a data set that has them (cifar100 or an hf: set with such a column)"
        )
    classes = len(np.unique(labels))
    if scheme == "shards" and classes_per_client > classes:
        raise ValueError(
            f"partition = 'shards' with classes-per-client = {classes_per_client} on {dataset}, which has "
            f"{classes} classes; allowed: classes-per-client <= {classes}"
        )

    def build() -> list[np.ndarray]:
        from partitions.stats import build_partitioner  # flwr-datasets: not for the clients' partition_settings

        return build_partitioner(*settings).assign(labels, columns)

    fingerprint = local_fingerprint(dataset, data_dir)  # None: synthetic labels, nothing to keep
    try:
        check_no_empty_clients(cached_partition(fingerprint, settings, build) if fingerprint else build())
    except ValueError as error:
        what = {"dirichlet": f"Dirichlet(alpha={alpha}){' with balance' if balance else ''}",
                "dirichlet-client": f"client-wise Dirichlet(alpha={alpha})",
                "shards": f"#C = {classes_per_client} shards", "iid": "IID", "pachinko": "Pachinko allocation"}[scheme]
        raise ValueError(
            f"{what} over num-clients = {num_clients} with min-partition-size = {min_size} cannot be built "
            f"on {dataset} ({len(labels)} training samples): {error}"
        ) from None
