"""Data loaders (digits, IDX Fashion-MNIST, hub via flwr-datasets on a local set) and models."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch

from clients.models import build_model
from partitions.datasets import load_dataset, read_idx
from partitions.hub import load_hub_dataset


def _write_idx(path, array: np.ndarray, compress: bool):
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    (gzip.open if compress else open)(path, "wb").write(payload)


def test_digits_has_a_fixed_split():
    data = load_dataset("digits")
    assert data.x_train.shape == (1438, 1, 8, 8) and data.x_test.shape == (359, 1, 8, 8)
    assert data.num_classes == 10 and data.y_train.dtype == torch.int64
    again = load_dataset.__wrapped__("digits")
    assert torch.equal(data.y_test, again.y_test)


@pytest.mark.parametrize("compress", [True, False])
def test_fashion_mnist_from_idx_files(tmp_path, compress):
    rng = np.random.default_rng(0)
    suffix = ".gz" if compress else ""
    for prefix, n in (("train", 30), ("t10k", 10)):
        _write_idx(tmp_path / f"{prefix}-images-idx3-ubyte{suffix}", rng.integers(0, 255, (n, 28, 28)), compress)
        _write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte{suffix}", np.arange(n) % 10, compress)
    assert read_idx(tmp_path / f"t10k-labels-idx1-ubyte{suffix}").tolist() == list(np.arange(10) % 10)
    data = load_dataset.__wrapped__("fashion-mnist", str(tmp_path))
    assert data.x_train.shape == (30, 1, 28, 28) and data.x_test.shape == (10, 1, 28, 28)
    assert abs(float(data.x_train.mean())) < 1e-4  # standardized with train statistics


def test_missing_fashion_mnist_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="data-dir"):
        load_dataset.__wrapped__("fashion-mnist", str(tmp_path))


def test_hub_loading_path_on_a_local_dataset(tmp_path):
    """flwr-datasets' FederatedDataset loads a local parquet set laid out like a hub repo."""
    from datasets import ClassLabel, Dataset, Features, Image
    from PIL import Image as PILImage

    rng = np.random.default_rng(0)
    features = Features({"img": Image(), "label": ClassLabel(num_classes=3)})
    for split, n in (("train", 12), ("test", 6)):
        images = [PILImage.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)) for _ in range(n)]
        Dataset.from_dict({"img": images, "label": [i % 3 for i in range(n)]}, features=features).to_parquet(
            tmp_path / "data" / f"{split}-00000-of-00001.parquet"
        )
    data = load_hub_dataset(str(tmp_path))
    assert data.x_train.shape == (12, 3, 32, 32) and data.x_test.shape == (6, 3, 32, 32)
    assert data.num_classes == 3 and data.y_train.tolist() == [i % 3 for i in range(12)]


@pytest.mark.parametrize(
    "name, shape, parameters",
    [
        # conv 1·32·25+32, conv 32·32·25+32, fc 512·384+384, fc 384·128+128, fc 128·10+10
        ("fmnist-cnn", (1, 28, 28), 832 + 25_632 + 196_992 + 49_280 + 1_290),
        # conv 3·64·25+64, conv 64·64·25+64, fc 1600·384+384, fc 384·128+128, fc 128·10+10
        ("cifar-cnn", (3, 32, 32), 4_864 + 102_464 + 614_784 + 49_280 + 1_290),
        ("mlp", (1, 8, 8), 64 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10),
    ],
)
def test_the_image_setups_models_have_their_parameter_counts_and_output_shapes(name, shape, parameters):
    model = build_model(name, shape, 10)
    assert sum(p.numel() for p in model.parameters()) == parameters
    assert model(torch.zeros(4, *shape)).shape == (4, 10)


def test_model_refuses_wrong_input_shape():
    with pytest.raises(ValueError, match="needs inputs of shape"):
        build_model("fmnist-cnn", (3, 32, 32), 10)
