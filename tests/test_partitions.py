"""Partitions: disjoint, complete, sized, seeded; heterogeneity follows alpha and #C."""

from __future__ import annotations

import numpy as np
import pytest

from partitions import DirichletPartitioner, IidPartitioner, ShardPartitioner, class_count_table, plot_class_counts
from partitions.stats import build_partitioner


def _check_disjoint(parts):
    joined = np.concatenate(parts)
    assert len(joined) == len(np.unique(joined)), "a sample is in two partitions"
    return joined


def _mean_entropy(labels, parts):
    table = class_count_table(labels, parts, 10).drop(columns="total").to_numpy()
    p = table / table.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.nanmean(-np.nansum(np.where(p > 0, p * np.log(p), 0), axis=1)))


def test_iid_is_complete_balanced_and_shuffled(labels):
    parts = IidPartitioner(7, seed=3).assign(labels)
    joined = _check_disjoint(parts)
    assert sorted(joined.tolist()) == list(range(len(labels)))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    # Shuffled: partition 0 does not hold the first samples in storage order.
    assert not np.array_equal(parts[0], np.arange(len(parts[0])))
    assert _mean_entropy(labels, parts) > 0.95 * np.log(10)


def test_dirichlet_is_complete_with_minimum_size(labels):
    parts = DirichletPartitioner(20, alpha=0.3, min_partition_size=50, seed=0).assign(labels)
    joined = _check_disjoint(parts)
    assert sorted(joined.tolist()) == list(range(len(labels)))
    assert min(len(p) for p in parts) >= 50
    assert len({len(p) for p in parts}) > 1, "Dirichlet sizes should be unequal"


def test_dirichlet_heterogeneity_grows_as_alpha_shrinks(labels):
    entropies = [
        _mean_entropy(labels, DirichletPartitioner(20, alpha=a, min_partition_size=1, seed=0).assign(labels))
        for a in (100.0, 1.0, 0.1)
    ]
    assert entropies[0] > entropies[1] > entropies[2]


def test_dirichlet_alpha_zero_gives_one_class_per_client(labels):
    parts = DirichletPartitioner(20, alpha=0, seed=0).assign(labels)
    _check_disjoint(parts)
    table = class_count_table(labels, parts, 10)
    assert ((table.drop(columns="total") > 0).sum(axis=1) == 1).all()
    assert table["total"].sum() == len(labels)
    assert (table["total"] == 300).all()  # 600 per class, two clients per class


def test_dirichlet_impossible_minimum_is_a_clear_error(labels):
    with pytest.raises(ValueError, match="min-partition-size"):
        DirichletPartitioner(50, alpha=0.01, min_partition_size=500, max_redraws=5).assign(labels)


def test_shards_equal_sizes_and_at_most_k_classes(labels):
    parts = ShardPartitioner(30, shards_per_client=2, seed=0).assign(labels)
    _check_disjoint(parts)
    assert {len(p) for p in parts} == {200}  # 6000 / 60 shards = 100 per shard, 2 shards
    table = class_count_table(labels, parts, 10)
    assert ((table.drop(columns="total") > 0).sum(axis=1) <= 2).all()


def test_partitions_are_seeded(labels):
    for scheme in ("iid", "dirichlet", "dirichlet-client", "shards"):
        a = build_partitioner(scheme, 10, seed=5, alpha=0.5).assign(labels)
        b = build_partitioner(scheme, 10, seed=5, alpha=0.5).assign(labels)
        c = build_partitioner(scheme, 10, seed=6, alpha=0.5).assign(labels)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
        assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_works_as_flwr_datasets_partitioner(labels):
    from datasets import Dataset

    dataset = Dataset.from_dict({"label": labels.tolist(), "index": list(range(len(labels)))})
    partitioner = ShardPartitioner(10, shards_per_client=2, seed=0)
    partitioner.dataset = dataset
    part = partitioner.load_partition(3)
    assert part["index"] == partitioner.assign(labels)[3].tolist()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="alpha"):
        DirichletPartitioner(10, alpha=-1)
    with pytest.raises(ValueError, match="num_partitions"):
        IidPartitioner(0)
    with pytest.raises(ValueError, match="shards_per_client"):
        ShardPartitioner(10, shards_per_client=0)


def test_class_count_figure(labels, tmp_path):
    parts = DirichletPartitioner(10, alpha=0.5, seed=0).assign(labels)
    table = class_count_table(labels, parts, 10)
    assert table.shape == (10, 11)
    path = plot_class_counts(table, tmp_path / "counts.png")
    assert path.stat().st_size > 1000


def _inside(inner, outer, tolerance=1.0) -> bool:
    return (inner.x0 >= outer.x0 - tolerance and inner.y0 >= outer.y0 - tolerance
            and inner.x1 <= outer.x1 + tolerance and inner.y1 <= outer.y1 + tolerance)


@pytest.mark.parametrize("num_clients, num_classes", [(10, 10), (100, 10), (10, 100), (100, 100)])
def test_class_count_figure_reads_right(num_clients, num_classes):
    import matplotlib.pyplot as plt

    from partitions.stats import class_counts_figure

    labels = np.repeat(np.arange(num_classes), 60)
    parts = IidPartitioner(num_clients, seed=0).assign(labels)
    title = f"a long title that names the data set, the scheme and all {num_clients} clients of the partition " * 2
    fig = class_counts_figure(class_count_table(labels, parts, num_classes), title.strip())
    fig.canvas.draw()
    renderer, frame = fig.canvas.get_renderer(), fig.bbox
    ax = fig.axes[0]
    # The whole title is drawn and inside the figure (wrapped, not cut).
    assert ax.title.get_text().replace("\n", " ") == title.strip()
    assert _inside(ax.title.get_window_extent(renderer), frame)
    # Client ticks are whole numbers.
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)
    if num_classes <= 20:
        # Every class is in the legend, which lies inside the figure and outside the bars.
        legend = fig.legends[0]
        assert [t.get_text() for t in legend.get_texts()] == [str(c) for c in range(num_classes)]
        box = legend.get_window_extent(renderer)
        assert _inside(box, frame) and not box.overlaps(ax.get_window_extent(renderer))
    else:
        assert len(fig.axes) == 2 and fig.axes[1].get_ylabel() == "samples"  # a heat map and its colour bar
    plt.close(fig)


def test_dirichlet_balance_rule_by_hand():
    # Class sizes 8 and 4 over K = 2 clients, cap N/K = 6. Class 0 with p = (0.9, 0.1):
    # cuts ⌊(7.2, 8)⌋ → 7 and 1 samples. Client 0 now holds 7 ≥ 6, so for class 1 its
    # proportion is 0 and client 1 takes all 4 (without the rule: p = (0.5, 0.5) → 2 and 2).
    proportions = np.array([[[0.9, 0.1], [0.5, 0.5]]])
    sizes = np.array([8, 4])
    balanced = DirichletPartitioner(2, alpha=1.0, balance=True)._split_counts(proportions, sizes)
    plain = DirichletPartitioner(2, alpha=1.0)._split_counts(proportions, sizes)
    assert balanced[0].tolist() == [[7, 1], [0, 4]]
    assert plain[0].tolist() == [[7, 1], [2, 2]]


def test_ima_setting_dirichlet_0_05_over_100_clients_is_feasible_with_the_balance_rule():
    labels = np.repeat(np.arange(10), 6000)  # Fashion-MNIST's class counts
    parts = DirichletPartitioner(100, alpha=0.05, min_partition_size=10, balance=True, seed=0).assign(labels)
    assert min(len(p) for p in parts) >= 10
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))


# -- client-wise Dirichlet (Hsu et al. 2019; WIMA, FedSWA) -------------------------------
def test_client_dirichlet_gives_equal_sizes_without_reuse(labels):
    from partitions.client_dirichlet import ClientDirichletPartitioner

    parts = ClientDirichletPartitioner(20, alpha=0.1, seed=0).assign(labels)
    assert [len(p) for p in parts] == [len(labels) // 20] * 20  # N/K each, unlike the label-wise scheme
    assert sorted(_check_disjoint(parts).tolist()) == list(range(len(labels)))  # K·N/K = N: every sample once
    label_wise = DirichletPartitioner(20, alpha=0.1, min_partition_size=1, seed=0).assign(labels)
    assert len({len(p) for p in label_wise}) > 1


def test_client_dirichlet_concentrations_are_alpha_times_prior_or_alpha_each():
    from partitions.client_dirichlet import ClientDirichletPartitioner

    sizes = np.array([100.0, 300.0, 600.0])
    hsu = ClientDirichletPartitioner(4, alpha=2.0, concentration="class-prior")
    fedswa = ClientDirichletPartitioner(4, alpha=2.0, concentration="uniform")
    expected_hsu = np.random.default_rng(7).dirichlet([0.2, 0.6, 1.2], size=4)  # α·p, summing to α
    expected_fedswa = np.random.default_rng(7).dirichlet([2.0, 2.0, 2.0], size=4)  # α·1_C
    assert np.array_equal(hsu.class_mixes(np.random.default_rng(7), sizes), expected_hsu)
    assert np.array_equal(fedswa.class_mixes(np.random.default_rng(7), sizes), expected_fedswa)


def test_client_dirichlet_same_alpha_is_more_skewed_under_hsus_convention(labels):
    hsu = build_partitioner("dirichlet-client", 50, 0, alpha=1.0, client_concentration="class-prior")
    fedswa = build_partitioner("dirichlet-client", 50, 0, alpha=1.0, client_concentration="uniform")
    # Dir(0.1·1) vs Dir(1·1) over 10 classes: far fewer classes per client.
    assert _mean_entropy(labels, hsu.assign(labels)) < 0.6 * _mean_entropy(labels, fedswa.assign(labels))


def test_client_dirichlet_drop_renormalises_over_the_classes_left():
    from partitions.client_dirichlet import ClientDirichletPartitioner

    labels = np.array([0] * 2 + [1] * 10)
    # α = 0: client 0's mix is class 0, client 1's class 1. Client 0 takes class 0's 2
    # samples, then (all its mass exhausted) the rest from class 1.
    parts = ClientDirichletPartitioner(2, alpha=0.0, samples_per_client=6, exhaustion="drop").assign(labels)
    assert [np.bincount(labels[p], minlength=2).tolist() for p in parts] == [[2, 4], [0, 6]]
    with pytest.raises(ValueError, match="refill"):
        ClientDirichletPartitioner(2, alpha=1.0, samples_per_client=7).assign(labels)


def test_client_dirichlet_refill_reuses_samples_as_fedswas_code(labels):
    from partitions.client_dirichlet import ClientDirichletPartitioner

    # FedSWA: exactly 500 per client; 20 × 500 > 6 000 samples, so pools are refilled.
    parts = ClientDirichletPartitioner(20, alpha=0.1, samples_per_client=500, concentration="uniform",
                                       exhaustion="refill").assign(labels)
    assert [len(p) for p in parts] == [500] * 20
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) < len(joined)  # reused
    one_class = ClientDirichletPartitioner(10, alpha=0.0, samples_per_client=900, exhaustion="refill").assign(labels)
    assert all(set(labels[p].tolist()) == {k} for k, p in enumerate(one_class))  # a class of 600 served 900 times


def test_client_dirichlet_refill_reshuffles_a_class_before_drawing_it_again(labels):
    """Clients k and k + 10 share class k (α = 0) and take 400 of its 600 samples each:
    the second takes the 200 its pool has left, then 200 of the reshuffled pool. Drawn
    again in the same order they would be the first 200 of the first client's 400; a
    reshuffled pool puts about a third of them outside it (the FedSWA authors' code)."""
    from partitions.client_dirichlet import ClientDirichletPartitioner

    parts = ClientDirichletPartitioner(20, alpha=0.0, samples_per_client=400, exhaustion="refill").assign(labels)
    for k in range(10):
        first, second = parts[k], parts[k + 10]
        assert len(np.unique(first)) == 400 and np.isin(second, first).sum() < 200, k


def test_client_dirichlet_bad_arguments_are_refused():
    from partitions.client_dirichlet import ClientDirichletPartitioner

    for kwargs, key in (({"alpha": -1}, "alpha"), ({"alpha": 1, "concentration": "hsu"}, "concentration"),
                        ({"alpha": 1, "exhaustion": "reuse"}, "exhaustion"), ({"alpha": 1, "samples_per_client": 0},
                                                                             "samples_per_client")):
        with pytest.raises(ValueError, match=key):
            ClientDirichletPartitioner(10, **kwargs)


def test_a_partitioner_is_a_flwr_datasets_partitioner_that_federated_dataset_takes(labels, tmp_path):
    """Basin's partitioners are registered as virtual subclasses of flwr-datasets'
    Partitioner (partitions/base.py): FederatedDataset takes one and loads its partitions."""
    from datasets import Dataset
    from flwr_datasets import FederatedDataset
    from flwr_datasets.partitioner import Partitioner

    path = tmp_path / "train.parquet"
    Dataset.from_dict({"label": labels.tolist(), "index": list(range(len(labels)))}).to_parquet(str(path))
    partitioner = ShardPartitioner(10, shards_per_client=2, seed=0)
    assert isinstance(partitioner, Partitioner)
    fds = FederatedDataset(dataset="parquet", data_files=str(path), partitioners={"train": partitioner}, shuffle=False)
    assert fds.load_partition(3, "train")["index"] == partitioner.assign(labels)[3].tolist()
    with pytest.raises(ValueError, match="only once"):
        partitioner.dataset = fds.load_split("train")


