"""Build a partitioner from run-config values; per-client class counts and their figure."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from partitions.base import LabelPartitioner

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
    # Imported here: the partitioners are flwr-datasets Partitioners (seconds of import),
    # and a process that reads a cached partition (clients/data.py) never needs them.
    from partitions.dirichlet import DirichletPartitioner
    from partitions.iid import IidPartitioner
    from partitions.shards import ShardPartitioner

    if scheme == "iid":
        return IidPartitioner(num_partitions, seed=seed)
    if scheme == "dirichlet":
        return DirichletPartitioner(num_partitions, alpha, min_partition_size, balance, seed=seed)
    if scheme == "shards":
        return ShardPartitioner(num_partitions, classes_per_client, seed=seed)
    raise ValueError(f"unknown partition scheme {scheme!r}; allowed: {', '.join(PARTITION_SCHEMES)}")


def partition_notation(config: Mapping[str, Any]) -> str:
    """The partition of a run config in the papers' notation: Dir(0.1), #C=2, IID."""
    if config["partition"] == "dirichlet":
        return f"Dir({config['alpha']:g})" + (", balanced" if config.get("dirichlet-balance") else "")
    if config["partition"] == "shards":
        return f"#C={config['classes-per-client']}"
    return "IID"


def client_class_counts(labels: np.ndarray, indices: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Per-client class counts: an array of shape (num_clients, num_classes)."""
    return np.stack([np.bincount(labels[idx], minlength=num_classes) for idx in indices])


def class_count_table(labels: np.ndarray, indices: list[np.ndarray], num_classes: int) -> pd.DataFrame:
    """One row per client, one column per class, plus the client's total."""
    counts = client_class_counts(np.asarray(labels), indices, num_classes)
    table = pd.DataFrame(counts, columns=[f"class-{c}" for c in range(num_classes)])
    table.index.name = "partition-id"
    table["total"] = counts.sum(axis=1)
    return table


# Up to this many classes the figure is stacked bars with one legend entry per class; beyond
# it, a heat map (clients × classes) with a colour bar.
MAX_LEGEND_CLASSES = 20


def class_counts_figure(table: pd.DataFrame, title: str = ""):
    """The figure of a class-count table: stacked bars per client with the legend outside
    the axes (≤ 20 classes), or a heat map of samples per client and class; integer client
    ticks; the title wrapped to the figure's width. Returns the matplotlib Figure."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    class_columns = [c for c in table.columns if c.startswith("class-")]
    clients = table.index.to_numpy()
    width = min(max(7.0, 0.1 * len(table) + 4), 20.0)
    fig, ax = plt.subplots(figsize=(width, 4.8), layout="constrained")
    if len(class_columns) <= MAX_LEGEND_CLASSES:
        colors = plt.get_cmap("tab20" if len(class_columns) > 10 else "tab10")
        bottom = np.zeros(len(table))
        for i, column in enumerate(class_columns):
            values = table[column].to_numpy()
            ax.bar(clients, values, bottom=bottom, width=0.9, color=colors(i % colors.N),
                   label=column.removeprefix("class-"))
            bottom += values
        ax.set_ylabel("samples")
        ax.set_xlim(clients.min() - 0.6, clients.max() + 0.6)
        ax.set_ylim(0, 1.05 * bottom.max())
        fig.legend(title="class", loc="outside right upper", fontsize="small", ncols=1 if len(class_columns) <= 10 else 2)
    else:
        counts = table[class_columns].to_numpy().T  # classes × clients
        image = ax.imshow(counts, aspect="auto", interpolation="nearest", cmap="viridis", origin="lower",
                          extent=(clients.min() - 0.5, clients.max() + 0.5, -0.5, len(class_columns) - 0.5))
        ax.set_ylabel("class")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        fig.colorbar(image, ax=ax, label="samples")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("client (partition id)")
    characters = int(width * 9)  # about 9 title characters per inch at the default size
    ax.set_title("\n".join(textwrap.wrap(title or "samples per class and client", characters)))
    return fig


def plot_class_counts(table: pd.DataFrame, path: Path, title: str = "") -> Path:
    """Save :func:`class_counts_figure` as a PNG (the heterogeneity to look at)."""
    import matplotlib.pyplot as plt

    fig = class_counts_figure(table, title)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
