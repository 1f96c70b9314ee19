"""Build a partitioner from run-config values; per-client class counts and their figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from partitions.base import LabelPartitioner, client_class_counts
from partitions.dirichlet import DirichletPartitioner
from partitions.iid import IidPartitioner
from partitions.shards import ShardPartitioner

PARTITION_SCHEMES = ("iid", "dirichlet", "shards")


def build_partitioner(
    scheme: str,
    num_partitions: int,
    seed: int,
    alpha: float = 0.5,
    classes_per_client: int = 2,
    min_partition_size: int = 10,
    balance: bool = False,
) -> LabelPartitioner:
    """The partitioner of a scheme named in the run config (``partition`` key)."""
    if scheme == "iid":
        return IidPartitioner(num_partitions, seed=seed)
    if scheme == "dirichlet":
        return DirichletPartitioner(num_partitions, alpha, min_partition_size, balance, seed=seed)
    if scheme == "shards":
        return ShardPartitioner(num_partitions, classes_per_client, seed=seed)
    raise ValueError(f"unknown partition scheme {scheme!r}; allowed: {', '.join(PARTITION_SCHEMES)}")


def class_count_table(labels: np.ndarray, indices: list[np.ndarray], num_classes: int) -> pd.DataFrame:
    """One row per client, one column per class, plus the client's total."""
    counts = client_class_counts(np.asarray(labels), indices, num_classes)
    table = pd.DataFrame(counts, columns=[f"class-{c}" for c in range(num_classes)])
    table.index.name = "partition-id"
    table["total"] = counts.sum(axis=1)
    return table


def plot_class_counts(table: pd.DataFrame, path: Path, title: str = "") -> Path:
    """A stacked bar per client of its class counts (how heterogeneous the split is)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    class_columns = [c for c in table.columns if c.startswith("class-")]
    width = min(max(6.0, 0.12 * len(table) + 2), 24.0)
    fig, ax = plt.subplots(figsize=(width, 4))
    bottom = np.zeros(len(table))
    colors = plt.get_cmap("tab20" if len(class_columns) > 10 else "tab10")
    for i, column in enumerate(class_columns):
        values = table[column].to_numpy()
        ax.bar(table.index, values, bottom=bottom, width=0.9, color=colors(i % colors.N), label=column)
        bottom += values
    ax.set_xlabel("client (partition id)")
    ax.set_ylabel("samples")
    ax.set_title(title or "samples per class and client")
    if len(class_columns) <= 20:
        ax.legend(ncol=min(len(class_columns), 10), fontsize="x-small", loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
