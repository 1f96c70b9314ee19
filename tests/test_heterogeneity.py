"""Heterogeneity beyond label skew: Pachinko allocation, feature + label skew by domain,
natural partitions, their data sets (loaded offline through the real hub path), the models
they need and the next-character task."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clients.data import partition_labels_of
from clients.models import build_model
from clients.training import LocalTrainingConfig, evaluate, train_local
from experiments.runtime.run_config import resolve_config
from partitions.datasets import load_dataset
from partitions.domains import DomainPartitioner
from partitions.iid import IidPartitioner
from partitions.natural import NaturalPartitioner
from partitions.pachinko import PachinkoPartitioner
from partitions.stats import build_partitioner, class_count_table
from partitions.text import IGNORE_INDEX, VOCABULARY, encode_text
from strategies.config import ConfigError
from tests.miniature import TEXT

# CIFAR-100's shape: 100 fine labels, 5 per coarse label, 500 samples each.
FINE = np.repeat(np.arange(100), 500)
COARSE = FINE // 5


# --- Pachinko -----------------------------------------------------------------------------


def test_pachinko_gives_every_client_n_samples_and_uses_each_sample_once():
    parts = PachinkoPartitioner(500, seed=0).assign(FINE, {"coarse": COARSE})  # WIMA's 500 × 100
    assert [len(p) for p in parts] == [100] * 500
    used = np.concatenate(parts)
    assert len(np.unique(used)) == len(used) == len(FINE)  # K·n = N: every sample, exactly once
    again = PachinkoPartitioner(500, seed=0).assign(FINE, {"coarse": COARSE})
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def _marginal_errors(clients: int) -> tuple[float, float]:
    """Largest deviation from their Dirichlet means (1/20, 1/5) of the clients' mean coarse
    share and of the fine shares within each coarse label over all clients' samples of it."""
    parts = PachinkoPartitioner(clients, samples_per_client=40, seed=1).assign(FINE, {"coarse": COARSE})
    coarse_share = np.stack([np.bincount(COARSE[p], minlength=20) / len(p) for p in parts])
    pooled = np.bincount(FINE[np.concatenate(parts)], minlength=100).reshape(20, 5)
    fine_share = pooled / pooled.sum(axis=1, keepdims=True)
    return float(np.abs(coarse_share.mean(axis=0) - 1 / 20).max()), float(np.abs(fine_share - 1 / 5).max())


def test_pachinko_marginals_approach_their_dirichlet_means_as_clients_grow():
    few, many = _marginal_errors(10), _marginal_errors(600)
    assert many[0] < few[0] and many[1] < few[1]
    assert many[0] < 0.015 and many[1] < 0.05


def test_pachinko_concentrates_clients_on_few_coarse_labels_with_spread_fine_labels():
    parts = PachinkoPartitioner(100, samples_per_client=100, alpha=0.1, beta=10.0, seed=0).assign(FINE, {"coarse": COARSE})
    coarse_used = [len(np.unique(COARSE[p])) for p in parts]
    spread = PachinkoPartitioner(100, samples_per_client=100, alpha=100.0, seed=0).assign(FINE, {"coarse": COARSE})
    assert np.mean(coarse_used) < 9 < 18 < np.mean([len(np.unique(COARSE[p])) for p in spread])
    top = [np.bincount(COARSE[p], minlength=20).max() / len(p) for p in parts]
    assert np.mean(top) > 0.4
    # Dir(10) over 5 fine labels: the dominant coarse label's 5 fine labels are all present.
    dominant = [np.unique(FINE[p][COARSE[p] == np.bincount(COARSE[p]).argmax()]) for p in parts]
    assert np.mean([len(d) for d in dominant]) > 4


def test_pachinko_renormalises_when_labels_run_out():
    fine, coarse = np.repeat(np.arange(10), 6), np.repeat(np.arange(2), 30)  # 60 samples, 2 coarse × 5 fine
    parts = PachinkoPartitioner(6, alpha=0.05, beta=0.05, seed=3).assign(fine, {"coarse": coarse})
    assert sorted(np.concatenate(parts).tolist()) == list(range(60))


def test_pachinko_refuses_what_it_cannot_build():
    with pytest.raises(ValueError, match="alpha and beta must be > 0"):
        PachinkoPartitioner(10, alpha=0)
    with pytest.raises(ValueError, match="need 60000"):
        PachinkoPartitioner(600, samples_per_client=100).assign(FINE, {"coarse": COARSE})
    with pytest.raises(ValueError, match="needs the data set's 'coarse' column"):
        PachinkoPartitioner(10).assign(FINE)


# --- domains and natural ids --------------------------------------------------------------


def test_domain_partition_splits_each_domain_on_its_own_disjointly_and_completely():
    rng = np.random.default_rng(0)
    domains = rng.integers(0, 3, 900)
    labels = rng.integers(0, 5, 900)
    parts = build_partitioner("dirichlet", 12, 0, alpha=0.5, min_partition_size=5, clients_per_domain=4).assign(
        labels, {"domain": domains})
    assert len(parts) == 12
    assert sorted(np.concatenate(parts).tolist()) == list(range(900))
    for client, part in enumerate(parts):
        assert set(domains[part]) == {client // 4}  # domain-major partition ids
    iid = DomainPartitioner(2, lambda m, s: IidPartitioner(m, seed=s), 3).assign(labels, {"domain": domains})
    assert [len(p) for p in iid[:2]] == [len(x) for x in np.array_split(np.flatnonzero(domains == 0), 2)]
    with pytest.raises(ValueError, match="has 3 domains, the partition expects 2"):
        DomainPartitioner(2, lambda m, s: IidPartitioner(m, seed=s), 2).assign(labels, {"domain": domains})


def test_natural_partition_maps_ids_to_clients_one_to_one_keeping_the_largest():
    ids = np.array([5, 3, 3, 9, 5, 5, 7, 3, 9, 1])
    parts = NaturalPartitioner(3).assign(np.zeros(10, int), {"natural-id": ids})
    # Ids 3 and 5 (3 samples each) and 9 (2) are kept, in sorted id order; 7 and 1 are left out.
    assert [p.tolist() for p in parts] == [[1, 2, 7], [0, 4, 5], [3, 8]]
    assert [set(ids[p]) for p in parts] == [{3}, {5}, {9}]
    with pytest.raises(ValueError, match="num-clients = 6 but the data set has 5 natural ids"):
        NaturalPartitioner(6).assign(np.zeros(10, int), {"natural-id": ids})


# --- data sets through the real loading path ------------------------------------------------


def test_hub_sets_load_with_their_side_columns(miniature_hub):
    cifar = load_dataset(f"hf:{miniature_hub['cifar100']}")
    assert cifar.x_train.shape == (400, 3, 8, 8) and cifar.num_classes == 10
    np.testing.assert_array_equal(cifar.columns["coarse"], cifar.y_train.numpy() // 5)

    domains = load_dataset(f"hf:{miniature_hub['digit_five']}")
    assert domains.domain_names == ("mnist", "svhn", "usps")
    assert domains.x_train.shape[1:] == (3, 10, 10)  # the first image's size, in colour: one image was
    assert len(domains.x_train) == 3 * 48 and len(domains.x_test) == 3 * 12  # 20 % of each domain held out
    assert np.bincount(domains.test_domains).tolist() == [12, 12, 12]

    femnist = load_dataset(f"hf:{miniature_hub['femnist']}")
    ids = femnist.columns["natural-id"]
    assert np.bincount(ids).tolist() == [n - round(0.1 * n) for n in (10, 15, 20, 25, 30, 35)]  # 10 % per writer held out
    assert femnist.num_classes == 4 and femnist.x_train.shape[1:] == (1, 28, 28)

    text = load_dataset(f"hf:{miniature_hub['shakespeare']}")
    assert text.is_text and text.x_train.shape[1] == 80 and text.num_classes == len(VOCABULARY) + 2
    assert np.bincount(text.columns["natural-id"]).tolist() == [36] * 4


def test_next_character_targets_are_the_snippet_shifted_by_one():
    inputs, targets = encode_text(["abc", "x" * 100], ["d", "y"])
    lookup = {c: i + 2 for i, c in enumerate(VOCABULARY)}
    assert inputs[0, :4].tolist() == [lookup["a"], lookup["b"], lookup["c"], 0]
    assert targets[0, :4].tolist() == [lookup["b"], lookup["c"], lookup["d"], IGNORE_INDEX]
    assert (targets[1] == lookup["x"]).sum() == 79 and targets[1, -1] == lookup["y"]  # the last 80 characters
    assert partition_labels_of(type("D", (), {"y_train": torch.from_numpy(targets)})()).tolist() == [lookup["d"], lookup["y"]]


def test_partition_table_names_each_clients_domain_and_counts_sequence_targets():
    table = class_count_table(np.array([0, 1, 1, 2]), [np.array([0, 1]), np.array([2, 3])], 3, np.array([0, 0, 1, 1]),
                              ("mnist", "svhn"))
    assert table["domain"].tolist() == ["mnist", "svhn"] and table["total"].tolist() == [2, 2]
    sequences = class_count_table(np.array([[0, 1, IGNORE_INDEX], [2, 2, 2]]), [np.array([0]), np.array([1])], 3)
    assert sequences[["class-0", "class-1", "class-2"]].to_numpy().tolist() == [[1, 1, 0], [0, 0, 3]]


# --- models and the next-character task ------------------------------------------------------


@pytest.mark.parametrize("name, shape, classes, parameters, output", [
    ("alexnet-gn", (3, 227, 227), 7, 57_051_207, (2, 7)),
    ("digit5-cnn", (3, 28, 28), 10, 13_423_434, (2, 10)),
    ("femnist-cnn", (1, 28, 28), 62, 1_206_590, (2, 62)),
    ("char-lstm", (80,), 82, 820_450, (2, 82, 80)),
])
def test_the_domain_and_text_models_have_their_parameter_counts_and_output_shapes(name, shape, classes, parameters, output):
    model = build_model(name, shape, classes)
    assert sum(p.numel() for p in model.parameters()) == parameters
    x = torch.randint(0, classes, (2, *shape)) if name == "char-lstm" else torch.randn(2, *shape)
    assert tuple(model(x).shape) == output
    assert model.classifier.out_features == classes


def test_image_models_refuse_token_sequences():
    with pytest.raises(ValueError, match="takes images; the data set holds token sequences"):
        build_model("mlp", (80,), 82)


def test_evaluation_scores_every_position_but_padding():
    class Fixed(torch.nn.Module):
        def forward(self, x):  # predicts class 1 everywhere: (N, 3 classes, 4 positions)
            return torch.tensor([0.0, 5.0, 0.0]).reshape(1, 3, 1).expand(len(x), 3, 4)

    y = torch.tensor([[1, 1, 0, IGNORE_INDEX], [1, 2, IGNORE_INDEX, IGNORE_INDEX]])
    loss, accuracy = evaluate(Fixed(), torch.zeros(2, 4), y)
    assert accuracy == pytest.approx(3 / 5)  # 5 scored positions, 3 of them class 1
    p = torch.softmax(torch.tensor([0.0, 5.0, 0.0]), 0)
    assert loss == pytest.approx(float(-(3 * p[1].log() + 2 * p[0].log()) / 5), rel=1e-5)


def test_the_lstm_learns_next_characters_of_a_repeated_text_in_a_few_steps():
    text = TEXT * 3
    starts = range(0, 400, 3)
    inputs, targets = encode_text([text[i : i + 80] for i in starts], [text[i + 80] for i in starts])
    x, y = torch.from_numpy(inputs), torch.from_numpy(targets)
    majority = np.bincount(targets.ravel()).max() / targets.size  # always guessing ' ': about 0.2
    torch.manual_seed(0)
    model = build_model("char-lstm", (80,), len(VOCABULARY) + 2)
    before = evaluate(model, x, y)[1]
    config = LocalTrainingConfig(lr=1.0, local_epochs=0, batch_size=16, local_steps=60, momentum=0.9, grad_clip=5.0)
    train_local(model, x, y, config, torch.Generator().manual_seed(0))
    after = evaluate(model, x, y)[1]
    assert before < majority and after > 2 * majority  # it reads the context, not only the frequencies


# --- configuration ----------------------------------------------------------------------------


def test_configs_that_cannot_work_are_refused_before_flower_starts():
    with pytest.raises(ConfigError, match="needs coarse labels; digits has none"):
        resolve_config({"partition": "pachinko"})
    with pytest.raises(ConfigError, match="needs a domain column; digits has none"):
        resolve_config({"partition": "iid", "clients-per-domain": 5})
    with pytest.raises(ConfigError, match="splits domains with a label scheme, but partition = 'pachinko'"):
        resolve_config({"partition": "pachinko", "clients-per-domain": 5})
    with pytest.raises(ConfigError, match="not a multiple of clients-per-domain = 3"):
        resolve_config({"num-clients": 10, "clients-per-domain": 3})
    with pytest.raises(ConfigError, match="cannot run strategy = 'moon'"):
        resolve_config({"model": "char-lstm", "strategy": "moon", "dataset": "hf:some/text"})
    config = resolve_config({"dataset": "cifar100", "partition": "pachinko", "num-clients": 100, "participation": 0.1})
    assert config["pachinko-alpha"] == 0.1 and config["pachinko-beta"] == 10.0
