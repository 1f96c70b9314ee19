"""Data: tensor data set loaders, one partitioner class per scheme, partition statistics.

The names below are imported on first use: a client process that only loads cached data
(partitions/cache.py) never imports flwr-datasets, pandas or matplotlib (seconds of
start-up per process).
"""

from importlib import import_module

_HOMES = {
    "TensorDataset": "partitions.datasets",
    "load_dataset": "partitions.datasets",
    "DirichletPartitioner": "partitions.dirichlet",
    "IidPartitioner": "partitions.iid",
    "ShardPartitioner": "partitions.shards",
    "build_partitioner": "partitions.stats",
    "class_count_table": "partitions.stats",
    "plot_class_counts": "partitions.stats",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'partitions' has no attribute {name!r}")
    return getattr(import_module(_HOMES[name]), name)
