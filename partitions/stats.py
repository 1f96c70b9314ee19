"""Build a partitioner from run-config values; per-client class counts and their figure."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from partitions.cache import MappedPartition, client_runs, partition_sizes

if TYPE_CHECKING:
    import pandas as pd

    from partitions.base import LabelPartitioner

# dirichlet: label-wise (each class split over clients; IMA, FedAlign); dirichlet-client:
# client-wise (each client's class mix; WIMA, FedSWA).
PARTITION_SCHEMES = ("iid", "dirichlet", "dirichlet-client", "shards", "pachinko", "natural")
# Schemes that can run inside each domain of a multi-domain data set (clients-per-domain > 0).
LABEL_SCHEMES = ("iid", "dirichlet", "dirichlet-client", "shards")


def build_partitioner(
    scheme: str,
    num_partitions: int,
    seed: int,
    alpha: float = 0.5,
    classes_per_client: int = 2,
    min_partition_size: int = 10,
    balance: bool = False,
    pachinko_alpha: float = 0.1,
    pachinko_beta: float = 10.0,
    clients_per_domain: int = 0,
    client_concentration: str = "class-prior",
    client_exhaustion: str = "drop",
    samples_per_client: int = 0,
) -> LabelPartitioner:
    """The partitioner of a scheme named in the run config (``partition`` key); with
    ``clients_per_domain`` > 0 the label scheme runs inside each domain."""
    # Imported here: the partitioners are flwr-datasets Partitioners (seconds of import),
    # and a process that reads a cached partition (clients/data.py) never needs them.
    from partitions.client_dirichlet import ClientDirichletPartitioner
    from partitions.dirichlet import DirichletPartitioner
    from partitions.domains import DomainPartitioner
    from partitions.iid import IidPartitioner
    from partitions.natural import NaturalPartitioner
    from partitions.pachinko import PachinkoPartitioner
    from partitions.shards import ShardPartitioner

    def label_scheme(clients: int, scheme_seed: int) -> LabelPartitioner:
        if scheme == "iid":
            return IidPartitioner(clients, seed=scheme_seed)
        if scheme == "dirichlet":
            return DirichletPartitioner(clients, alpha, min_partition_size, balance, seed=scheme_seed)
        if scheme == "dirichlet-client":
            return ClientDirichletPartitioner(
                clients, alpha, samples_per_client or None, client_concentration, client_exhaustion, seed=scheme_seed
            )
        return ShardPartitioner(clients, classes_per_client, seed=scheme_seed)

    if clients_per_domain > 0:
        if scheme not in LABEL_SCHEMES:
            raise ValueError(f"partition = {scheme!r} cannot run inside domains; allowed: {', '.join(LABEL_SCHEMES)}")
        if num_partitions % clients_per_domain:
            raise ValueError(f"num-clients = {num_partitions} is not a multiple of clients-per-domain = {clients_per_domain}")
        return DomainPartitioner(clients_per_domain, label_scheme, num_partitions // clients_per_domain, seed=seed)
    if scheme in LABEL_SCHEMES:
        return label_scheme(num_partitions, seed)
    if scheme == "pachinko":
        return PachinkoPartitioner(num_partitions, alpha=pachinko_alpha, beta=pachinko_beta, seed=seed)
    if scheme == "natural":
        return NaturalPartitioner(num_partitions, seed=seed)
    raise ValueError(f"unknown partition scheme {scheme!r}; allowed: {', '.join(PARTITION_SCHEMES)}")


def partition_notation(config: Mapping[str, Any]) -> str:
    """The partition of a run config in the papers' notation: Dir(0.1), #C=2, IID, PAM."""
    scheme = config["partition"]
    if scheme == "pachinko":
        return f"Pachinko(α={config['pachinko-alpha']:g}, β={config['pachinko-beta']:g})"
    if scheme == "natural":
        return "natural ids"
    if scheme == "dirichlet":
        notation = f"Dir({config['alpha']:g})" + (", balanced" if config.get("dirichlet-balance") else "")
    elif scheme == "dirichlet-client":
        concentration = "α·p" if config.get("client-dirichlet-concentration", "class-prior") == "class-prior" else "α·1"
        notation = f"client-wise Dir({config['alpha']:g}; {concentration}, {config.get('client-dirichlet-exhaustion', 'drop')})"
    elif scheme == "shards":
        notation = f"#C={config['classes-per-client']}"
    else:
        notation = "IID"
    if config.get("clients-per-domain", 0):
        notation += f" within each domain ({config['clients-per-domain']} clients each)"
    return notation


# Indices counted per vectorised step: bounds the step's temporary arrays (~100 MB).
COUNT_BLOCK_SAMPLES = 1 << 22


def client_class_counts(labels: np.ndarray, indices: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """Per-client class counts: an array of shape (num_clients, num_classes). Sequence
    targets (one row of labels per sample) count every scored position (padding, < 0, not).

    Counted over runs of consecutive clients, one ``bincount`` of (client, class) pairs
    each (a call per client took 7.7 s at 10⁶ clients); a cached partition's runs are read
    from its file (MappedPartition.blocks), so its 10⁶ clients' pages are not left mapped."""
    counts = np.zeros((len(indices), num_classes), dtype=np.int64)
    all_sizes = partition_sizes(indices)
    for clients, block in client_blocks(indices, all_sizes, COUNT_BLOCK_SAMPLES):
        sizes = all_sizes[clients]
        first_pair = np.repeat(np.arange(len(sizes), dtype=np.int64) * num_classes, sizes)
        values = labels[block]
        if values.ndim > 1:  # sequence targets: every position of a sample's row, unless padding
            first_pair = np.broadcast_to(first_pair[:, None], values.shape)
            scored = values >= 0
            first_pair, values = first_pair[scored], values[scored]
        counts[clients] = np.bincount(first_pair + values, minlength=len(sizes) * num_classes).reshape(-1, num_classes)
    return counts


def client_blocks(indices: Sequence[np.ndarray], sizes: np.ndarray,
                  max_samples: int) -> Iterator[tuple[slice, np.ndarray]]:
    """(a run of consecutive clients, their indices one after another), for every client in
    order (``sizes``: partition_sizes(indices)): a MappedPartition's read from its file,
    others' concatenated."""
    if isinstance(indices, MappedPartition):
        yield from indices.blocks(max_samples)
        return
    for clients in client_runs(sizes, max_samples):
        yield clients, np.concatenate([np.asarray(index, dtype=np.int64) for index in indices[clients]])


def class_count_table(
    labels: np.ndarray, indices: Sequence[np.ndarray], num_classes: int, domains: np.ndarray | None = None,
    domain_names: tuple[str, ...] = (),
) -> pd.DataFrame:
    """One row per client, one column per class, plus the client's total and, given the
    training samples' ``domains``, the domain(s) its samples come from."""
    import pandas as pd  # here: the ServerApp and the launcher import this module before their first round

    counts = client_class_counts(np.asarray(labels), indices, num_classes)
    table = pd.DataFrame(counts, columns=[f"class-{c}" for c in range(num_classes)])
    table.index.name = "partition-id"
    table["total"] = counts.sum(axis=1)
    if domains is not None:
        names = list(domain_names) or [str(d) for d in range(int(np.max(domains)) + 1)]
        table["domain"] = ["+".join(names[d] for d in np.unique(domains[idx])) for idx in indices]
    return table


# Up to this many classes the figure is stacked bars with one legend entry per class; beyond
# it, a heat map (clients × classes) with a colour bar.
MAX_LEGEND_CLASSES = 20


# More clients than this are drawn as a heat map: bars that narrow are not readable.
MAX_BAR_CLIENTS = 200


def class_counts_figure(table: pd.DataFrame, title: str = ""):
    """The figure of a class-count table: stacked bars per client with the legend outside
    the axes (≤ 20 classes and ≤ 200 clients), or a heat map of samples per client and
    class (one image: 10,000 clients' bars were 100,000 patches, a minute of drawing on the
    ServerApp's CPU); integer client ticks; the title wrapped to the figure's width.
    Returns the matplotlib Figure."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    class_columns = [c for c in table.columns if c.startswith("class-")]
    clients = table.index.to_numpy()
    width = min(max(7.0, 0.1 * len(table) + 4), 20.0)
    fig, ax = plt.subplots(figsize=(width, 4.8), layout="constrained")
    if len(class_columns) <= MAX_LEGEND_CLASSES and len(table) <= MAX_BAR_CLIENTS:
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
    if "domain" in table:  # feature skew: the clients of each domain between dashed lines
        for domain, members in table.groupby("domain", sort=False).groups.items():
            first, last = min(members), max(members)
            ax.axvline(first - 0.5, color="black", linestyle="--", linewidth=0.8)
            ax.text((first + last) / 2, 0.98, domain, transform=ax.get_xaxis_transform(), ha="center", va="top",
                    fontsize="small", bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0})
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
