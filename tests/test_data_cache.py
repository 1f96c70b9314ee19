"""The disk cache of decoded data sets and partitions (partitions/cache.py): a cached load
is bit for bit the decoded one, is read back without decoding, follows its source files,
survives a bad entry, and lets a client process start without the heavy libraries."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO, write_idx

import partitions.datasets as datasets
import partitions.hub as hub
from clients.data import partition_indices
from partitions.datasets import IDX_STEMS, load_dataset
from partitions.tensor_dataset import scaled_dataset

SETTINGS = ("dirichlet", 10, 0, 0.3, 2, 10, False, 0.1, 10.0, 0, "class-prior", "drop", 0)


def write_fashion_mnist(directory, seed: int = 0):
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for stem in IDX_STEMS:
        count = 50 if stem.startswith("train") else 20
        array = rng.integers(0, 256, (count, 28, 28)) if "images" in stem else rng.integers(0, 10, count)
        write_idx(directory / f"{stem}.gz", array)
    return directory


def assert_same(a, b):
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert (a.num_classes, a.black) == (b.num_classes, b.black)


def entries(cache, kind):
    return sorted((cache / kind).glob("*.npz")) + sorted((cache / kind).glob("*.npy"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BASIN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("normalize", [True, False])
def test_a_cached_data_set_is_the_decoded_one_and_is_read_back_without_decoding(tmp_path, cache, monkeypatch, normalize):
    source = str(write_fashion_mnist(tmp_path / "fmnist"))
    monkeypatch.setenv("BASIN_CACHE_DIR", "off")
    decoded = load_dataset.__wrapped__("fashion-mnist", source, normalize)
    assert not cache.exists()  # off: nothing written
    monkeypatch.setenv("BASIN_CACHE_DIR", str(cache))
    first = load_dataset.__wrapped__("fashion-mnist", source, normalize)
    assert len(entries(cache, "datasets")) == 1
    monkeypatch.setattr(datasets, "read_idx", lambda path: pytest.fail(f"decoded {path} again"))
    again = load_dataset.__wrapped__("fashion-mnist", source, normalize)
    assert_same(first, decoded)
    assert_same(again, decoded)
    assert again.fingerprint == first.fingerprint != ""


def test_a_replaced_source_file_is_a_new_entry(tmp_path, cache):
    source = write_fashion_mnist(tmp_path / "fmnist")
    before = load_dataset.__wrapped__("fashion-mnist", str(source))
    write_idx(source / "train-labels-idx1-ubyte.gz", (before.y_train.numpy() + 1) % 10)
    after = load_dataset.__wrapped__("fashion-mnist", str(source))
    assert torch.equal(after.y_train, (before.y_train + 1) % 10)
    assert after.fingerprint != before.fingerprint and len(entries(cache, "datasets")) == 2


def test_an_unreadable_entry_is_rebuilt(tmp_path, cache):
    source = str(write_fashion_mnist(tmp_path / "fmnist"))
    expected = load_dataset.__wrapped__("fashion-mnist", source)
    (entry,) = entries(cache, "datasets")
    entry.write_bytes(b"not a zip file")
    assert_same(load_dataset.__wrapped__("fashion-mnist", source), expected)
    with np.load(entry) as stored:  # replaced by a good one
        assert stored["x-train"].shape == (50, 1, 28, 28)


def test_a_cache_that_cannot_be_written_only_costs_time(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("BASIN_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    source = str(write_fashion_mnist(tmp_path / "fmnist"))
    monkeypatch.setenv("BASIN_CACHE_DIR", "off")
    expected = load_dataset.__wrapped__("fashion-mnist", source)
    monkeypatch.setenv("BASIN_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    assert_same(load_dataset.__wrapped__("fashion-mnist", source), expected)


def test_digits_cached_equal_decoded(cache, monkeypatch):
    first = load_dataset.__wrapped__("digits")
    monkeypatch.setenv("BASIN_CACHE_DIR", "off")
    assert_same(first, load_dataset.__wrapped__("digits"))


def test_a_partition_is_built_once_and_keyed_by_its_settings(cache, monkeypatch):
    import partitions.stats

    built = partition_indices.__wrapped__("digits", "", True, SETTINGS)
    assert len(entries(cache, "partitions")) == 1
    monkeypatch.setattr(partitions.stats, "build_partitioner", lambda *a: pytest.fail("built again"))
    again = partition_indices.__wrapped__("digits", "", True, SETTINGS)
    assert len(again) == 10 and all(np.array_equal(a, b) for a, b in zip(built, again))
    monkeypatch.undo()
    monkeypatch.setenv("BASIN_CACHE_DIR", str(cache))
    other_seed = partition_indices.__wrapped__("digits", "", True, (*SETTINGS[:2], 1, *SETTINGS[3:]))
    assert len(entries(cache, "partitions")) == 2
    assert any(not np.array_equal(a, b) for a, b in zip(built, other_seed))


def test_a_hub_set_is_cached_as_its_decoded_pixels(tmp_path, cache):
    from datasets import ClassLabel, Dataset, Features, Image
    from PIL import Image as PILImage

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
    features = Features({"img": Image(), "label": ClassLabel(num_classes=3)})
    for split in ("train", "test"):
        Dataset.from_dict({"img": [PILImage.fromarray(p) for p in pixels], "label": [i % 3 for i in range(6)]},
                          features=features).to_parquet(tmp_path / "hub" / "data" / f"{split}-00000-of-00001.parquet")
    first = hub.load_hub_dataset(str(tmp_path / "hub"))
    again = hub.load_hub_dataset(str(tmp_path / "hub"))
    expected = torch.from_numpy(pixels.transpose(0, 3, 1, 2).astype(np.float32) / 255.0)
    assert torch.equal(first.x_train, expected) and torch.equal(again.x_test, expected)
    assert len(entries(cache, "datasets")) == 1


def test_a_client_process_starts_without_the_heavy_libraries(cache):
    """With the cache warm (as the ServerApp leaves it), the ClientApp module loads without
    torch (Flower's simulation process loads it before starting Ray), and a client's work
    and partition without flwr-datasets, scikit-learn, torchvision, pandas or matplotlib
    (seconds of start-up per client process)."""
    partition_indices.__wrapped__("digits", "", True, SETTINGS)
    load_dataset.__wrapped__("digits")
    code = (
        "import sys\n"
        "from strategies.client_app import app\n"
        "assert 'torch' not in sys.modules, 'the ClientApp module imported torch'\n"
        "import clients.client_work\n"
        "from clients.data import client_tensors\n"
        "config = {'dataset': 'digits', 'data-dir': '', 'normalize': True, 'partition': 'dirichlet', 'alpha': 0.3,\n"
        "          'classes-per-client': 2, 'min-partition-size': 10, 'dirichlet-balance': False, 'seed': 0,\n"
        "          'pachinko-alpha': 0.1, 'pachinko-beta': 10.0, 'clients-per-domain': 0,\n"
        "          'client-dirichlet-concentration': 'class-prior', 'client-dirichlet-exhaustion': 'drop',\n"
        "          'samples-per-client': 0}\n"
        "x, y, _, _ = client_tensors(tuple(sorted(config.items())), 3, 10, 'cpu')\n"
        "assert len(y) > 0\n"
        "heavy = ('flwr_datasets', 'datasets', 'sklearn', 'torchvision', 'pandas', 'matplotlib')\n"
        "print(sorted(name for name in heavy if name in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "BASIN_CACHE_DIR": str(cache)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_images_are_scaled_as_numpys_float32_division_bit_for_bit():
    raw = np.random.default_rng(3).integers(0, 256, (64, 1, 28, 28), dtype=np.uint8)
    arrays = {"x-train": raw, "y-train": np.zeros(64, np.int64), "x-test": raw[:8], "y-test": np.zeros(8, np.int64),
              "num-classes": np.array(10), "max-value": np.array(255)}
    scaled = scaled_dataset("fashion-mnist", arrays, "")
    assert torch.equal(scaled.x_train, torch.from_numpy(raw.astype(np.float32) / 255.0))


def test_the_launchers_check_builds_the_partition_the_run_then_reads(tmp_path, cache, monkeypatch):
    """The feasibility check (before Flower starts) keeps the partition it built on the real
    labels; the ServerApp's and clients' partition_indices read that entry, and a second
    check finds it without building (so without importing flwr-datasets)."""
    import partitions.stats
    from partitions.feasibility import _check

    source = str(write_fashion_mnist(tmp_path / "fmnist"))
    settings = ("iid", 5, 0, 0.3, 2, 1, False, 0.1, 10.0, 0, "class-prior", "drop", 0)
    _check.__wrapped__("fashion-mnist", source, settings)
    assert len(entries(cache, "partitions")) == 1
    monkeypatch.setattr(partitions.stats, "build_partitioner", lambda *a: pytest.fail("built again"))
    _check.__wrapped__("fashion-mnist", source, settings)
    indices = partition_indices.__wrapped__("fashion-mnist", source, True, settings)
    assert sorted(np.concatenate(indices).tolist()) == list(range(50)) and len(indices) == 5


def test_files_decoded_before_are_not_read_again_by_the_data_check(tmp_path, cache, monkeypatch):
    import partitions.availability as availability

    source = write_fashion_mnist(tmp_path / "fmnist")
    read = []
    real = availability._idx_problem
    monkeypatch.setattr(availability, "_idx_problem", lambda path: read.append(path) or real(path))
    monkeypatch.setattr(availability, "_fashion_mnist_problem", availability._fashion_mnist_problem.__wrapped__)
    assert availability.data_problem("fashion-mnist", str(source)) is None and len(read) == 4
    load_dataset.__wrapped__("fashion-mnist", str(source))  # decoded completely: now in the cache
    write_idx(source / "t10k-labels-idx1-ubyte.gz", np.arange(20) % 10)  # new contents: read again
    read.clear()
    assert availability.data_problem("fashion-mnist", str(source)) is None and len(read) == 4
    load_dataset.__wrapped__("fashion-mnist", str(source))
    read.clear()
    assert availability.data_problem("fashion-mnist", str(source)) is None and read == []


def test_a_cached_partition_is_one_mapped_file_of_read_only_views_and_a_damaged_one_is_rebuilt(tmp_path, monkeypatch):
    from partitions import cache

    monkeypatch.setenv("BASIN_CACHE_DIR", str(tmp_path))
    clients = [np.array([5, 1, 9]), np.array([], dtype=np.int64), np.array([2])]
    built = []

    def build():
        built.append(1)
        return clients

    first = cache.cached_partition("data", ("iid", 3), build)
    again = cache.cached_partition("data", ("iid", 3), build)
    assert len(built) == 1 and [a.tolist() for a in again] == [[5, 1, 9], [], [2]]
    # plain ndarray views (slicing np.memmap costs a Python call per view) of the mapped file
    assert all(type(a) is np.ndarray and isinstance(a.base.base, np.memmap) for a in again)
    assert not again[0].flags.writeable  # the mapping is shared: nobody may write into it
    assert [a.tolist() for a in first] == [[5, 1, 9], [], [2]]
    assert again[-1].tolist() == [2] and [a.tolist() for a in again[1:]] == [[], [2]]
    assert again.sizes().tolist() == [3, 0, 1]
    with pytest.raises(IndexError):
        again[3]
    (entry,) = (tmp_path / "partitions").glob("*.npy")
    entry.write_bytes(entry.read_bytes()[:-8])  # a truncated file: read fails, built again
    assert [a.tolist() for a in cache.cached_partition("data", ("iid", 3), build)] == [[5, 1, 9], [], [2]]
    assert len(built) == 2


def random_partition(rng, num_clients: int, num_samples: int) -> list[np.ndarray]:
    """Disjoint clients of random sizes over num_samples samples, some empty."""
    cuts = np.sort(rng.integers(0, num_samples, num_clients - 1))
    return np.split(rng.permutation(num_samples).astype(np.int64), cuts)


@pytest.mark.parametrize("source", ["list", "cached"])
def test_class_counts_over_blocks_of_clients_are_each_clients_own_counts(tmp_path, monkeypatch, source):
    """Counted in blocks of consecutive clients (a block smaller than some clients, empty
    clients among them), read from the cached file or concatenated from a list: every
    client's counts are np.bincount of its own labels; sequence targets skip padding."""
    import partitions.stats as stats
    from partitions import cache

    monkeypatch.setenv("BASIN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(stats, "COUNT_BLOCK_SAMPLES", 7)
    rng = np.random.default_rng(5)
    clients = random_partition(rng, 40, 300)
    assert any(len(c) == 0 for c in clients) and any(len(c) > 7 for c in clients)
    if source == "cached":
        cache.cached_partition("labels", ("random",), lambda: clients)
        clients = cache.cached_partition("labels", ("random",), lambda: pytest.fail("built again"))
        assert isinstance(clients, cache.MappedPartition)
    labels = rng.integers(0, 4, 300)
    expected = [np.bincount(labels[c], minlength=4) for c in clients]
    assert stats.client_class_counts(labels, clients, 4).tolist() == [e.tolist() for e in expected]
    targets = np.where(rng.random((300, 3)) < 0.3, -100, rng.integers(0, 4, (300, 3)))
    expected = [np.bincount(targets[c][targets[c] >= 0], minlength=4) for c in clients]
    assert stats.client_class_counts(targets, clients, 4).tolist() == [e.tolist() for e in expected]


def test_counting_a_cached_partitions_classes_leaves_none_of_its_pages_in_the_process(tmp_path, monkeypatch):
    """The class counts of every client are read from the cached file in blocks, not through
    the mapped views: at 10⁶ clients the views' pages were 2.4 GB held by the ServerApp."""
    import psutil

    import partitions.stats as stats
    from partitions import cache

    monkeypatch.setenv("BASIN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(stats, "COUNT_BLOCK_SAMPLES", 1 << 16)  # small temporaries
    num_samples = 5_000_000  # a 40 MB entry
    cache.cached_partition("pages", ("random",), lambda: random_partition(np.random.default_rng(0), 10_000, num_samples))
    clients = cache.cached_partition("pages", ("random",), lambda: pytest.fail("built again"))
    labels = np.zeros(num_samples, dtype=np.int64)
    process = psutil.Process()
    before = process.memory_full_info().uss
    counts = stats.client_class_counts(labels, clients, 2)
    grown = process.memory_full_info().uss - before
    assert counts[:, 0].sum() == num_samples
    assert grown < 10 * 2**20, f"{grown / 2**20:.0f} MiB more held after counting"


@pytest.mark.slow
def test_two_launchers_at_once_on_an_empty_cache_both_complete_and_leave_it_whole(tmp_path):
    """Both decode the data and build the partition at the same moment: each writes its
    entry under a name of its own and renames it, so neither reads the other's half."""
    from experiments.runtime.reproducible import compare_runs

    env = {**os.environ, "BASIN_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    # One client a round: one client process per launcher (~2.6 CPU-s to start).
    sets = [arg for key, value in {"num-clients": 4, "participation": 0.25, "num-rounds": 2, "device": "cpu"}.items()
            for arg in ("--set", f"{key}={value}")]
    launchers = [subprocess.Popen([sys.executable, "-m", "experiments.run", *sets, "--out", str(tmp_path / name)], cwd=REPO,
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for name in ("a", "b")]
    for launcher in launchers:
        _, err = launcher.communicate(timeout=300)
        assert launcher.returncode == 0, err[-2000:]
    assert compare_runs(tmp_path / "a", tmp_path / "b").identical  # the same config, the same bits
    entries = [path for path in (tmp_path / "cache").rglob("*") if path.is_file()]
    assert entries and not [path for path in entries if path.name.startswith(".")]  # no temporary file left
    for path in entries:  # every entry reads back whole
        loaded = np.load(path, allow_pickle=False)
        if hasattr(loaded, "files"):
            assert all(loaded[name].size >= 0 for name in loaded.files)
