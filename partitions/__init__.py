"""Data: tensor data set loaders, one partitioner class per scheme, partition statistics."""

from partitions.datasets import TensorDataset, load_dataset
from partitions.dirichlet import DirichletPartitioner
from partitions.iid import IidPartitioner
from partitions.shards import ShardPartitioner
from partitions.stats import build_partitioner, class_count_table, plot_class_counts

__all__ = [
    "DirichletPartitioner",
    "IidPartitioner",
    "ShardPartitioner",
    "TensorDataset",
    "build_partitioner",
    "class_count_table",
    "load_dataset",
    "plot_class_counts",
]
