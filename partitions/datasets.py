"""Dataset loaders returning whole train/test splits as tensors.

Small image sets fit in (GPU) memory, so Basin keeps them as float tensors and indexes
them directly instead of going through a DataLoader each step.

- ``digits``: scikit-learn's bundled 8×8 digits (no download); a fixed split
  (seed 0, 20 % test) since the data set has none.
- ``fashion-mnist``: the IDX files of Zalando's Fashion-MNIST from a directory
  (``data-dir``), by default the Debian package ``dataset-fashion-mnist``'s
  ``/usr/share/datasets/fashion-mnist``.
- ``cifar10``, ``cifar100`` or ``hf:<hub id>``: any Hugging Face image-classification
  data set through flwr-datasets (imported lazily; needs the network or a local copy
  given as a path in ``hf:<path>``).
"""

from __future__ import annotations

import gzip
import importlib.util
import struct
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from partitions.cache import cached_arrays, digest, file_digest

FASHION_MNIST_DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")
HUB_ALIASES = {"cifar10": "uoft-cs/cifar10", "cifar100": "uoft-cs/cifar100"}
# Per data set, the label column to prefer when a hub set has several ClassLabels.
HUB_LABEL_KEYS = {"uoft-cs/cifar100": "fine_label"}
# Fashion-MNIST's files, raw or .gz: train images and labels, test images and labels.
IDX_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
BUILTIN_DATASETS = ("digits", "fashion-mnist", *HUB_ALIASES)
# Input shape (C, H, W) of the built-in sets, known without loading them (config checks).
INPUT_SHAPES = {"digits": (1, 8, 8), "fashion-mnist": (1, 28, 28), "cifar10": (3, 32, 32), "cifar100": (3, 32, 32)}


@dataclass(frozen=True)
class TensorDataset:
    """Train and test splits: images (N, C, H, W) float32, labels (N,) int64; ``black`` is
    the value a black pixel has in each channel (0 for images scaled to [0, 1], −mean/std
    once standardised), what crop augmentation pads with."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    black: tuple[float, ...] = ()
    fingerprint: str = ""  # what its content depends on (partitions/cache.py); "" when unknown

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


def is_known_dataset(name: str) -> bool:
    return name in BUILTIN_DATASETS or (name.startswith("hf:") and len(name) > 3)


@lru_cache(maxsize=4)
def load_dataset(name: str, data_dir: str = "", normalize: bool = True) -> TensorDataset:
    """Load a data set by name (cached per process: clients load it once): images scaled to
    [0, 1], then, with ``normalize``, standardised per channel with the training split's
    mean and std (the IMA authors' Fashion-MNIST is only scaled: ``normalize = false``)."""
    data = _load_scaled(name, data_dir)
    if not normalize:
        return replace(data, black=(0.0,) * data.input_shape[0])
    dims = (0, 2, 3)
    mean = data.x_train.mean(dim=dims, keepdim=True)
    std = data.x_train.std(dim=dims, keepdim=True).clamp_min(1e-8)
    black = tuple(float(v) for v in (-mean / std).flatten())
    # In place: the scaled images are this call's own (not cached), and a copy costs a
    # fresh allocation per process (~0.3 s for Fashion-MNIST).
    return replace(data, x_train=data.x_train.sub_(mean).div_(std), x_test=data.x_test.sub_(mean).div_(std), black=black)


def _load_scaled(name: str, data_dir: str) -> TensorDataset:
    # Not cached: load_dataset caches its result, so a process holds one copy of the images
    # (standardised or not), not also the scaled one it was computed from.
    if name == "digits":
        return _scaled(name, *_load_digits())
    if name == "fashion-mnist":
        return _scaled(name, *_load_fashion_mnist(Path(data_dir) if data_dir else FASHION_MNIST_DEFAULT_DIR))
    if name in HUB_ALIASES:
        return load_hub_dataset(HUB_ALIASES[name])
    if name.startswith("hf:"):
        return load_hub_dataset(name[3:])
    raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(BUILTIN_DATASETS)} or hf:<hub id>")


def _scaled(name: str, raw: dict[str, np.ndarray], fingerprint: str) -> TensorDataset:
    """Decoded arrays (partitions/cache.py's entry: uint8 images (N, C, H, W) with their
    largest value ``max-value``, int64 labels) as images scaled to [0, 1]."""
    scale = float(raw["max-value"])

    def images(split: str) -> torch.Tensor:
        return torch.from_numpy(raw[f"x-{split}"].astype(np.float32) / scale)

    return TensorDataset(
        name, images("train"), torch.from_numpy(raw["y-train"]), images("test"), torch.from_numpy(raw["y-test"]),
        int(raw["num-classes"]), fingerprint=fingerprint,
    )


def _raw_arrays(x_train, y_train, x_test, y_test, num_classes: int, max_value: int) -> dict[str, np.ndarray]:
    return {"x-train": np.ascontiguousarray(x_train, dtype=np.uint8), "y-train": np.asarray(y_train, dtype=np.int64),
            "x-test": np.ascontiguousarray(x_test, dtype=np.uint8), "y-test": np.asarray(y_test, dtype=np.int64),
            "num-classes": np.array(num_classes), "max-value": np.array(max_value)}


def _load_digits() -> tuple[dict[str, np.ndarray], str]:
    # The bundled file is found without importing scikit-learn (a second of start-up).
    package = importlib.util.find_spec("sklearn")
    source = Path(next(iter(package.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    fingerprint = digest(["digits", file_digest([source])])
    return cached_arrays("datasets", fingerprint, _decode_digits), fingerprint


def _decode_digits() -> dict[str, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = bunch.images.astype(np.uint8)[:, None]  # values 0..16
    order = np.random.default_rng(0).permutation(len(bunch.target))
    num_test = len(order) // 5
    test, train = order[:num_test], order[num_test:]
    return _raw_arrays(images[train], bunch.target[train], images[test], bunch.target[test], 10, 16)


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (optionally gzipped) into a numpy array."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file")
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _find_idx(directory: Path, stem: str) -> Path:
    for candidate in (directory / stem, directory / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"Fashion-MNIST file {stem}[.gz] not found in {directory}; install the Debian "
        "package dataset-fashion-mnist or set data-dir to a directory holding the IDX files"
    )


def _load_fashion_mnist(directory: Path) -> tuple[dict[str, np.ndarray], str]:
    files = [_find_idx(directory, stem) for stem in IDX_STEMS]
    fingerprint = digest(["fashion-mnist", file_digest(files)])

    def decode() -> dict[str, np.ndarray]:
        x_train, y_train, x_test, y_test = (read_idx(path) for path in files)
        return _raw_arrays(x_train[:, None], y_train, x_test[:, None], y_test, 10, 255)

    return cached_arrays("datasets", fingerprint, decode), fingerprint


def load_hub_dataset(hub_id: str) -> TensorDataset:
    """Load a Hugging Face image-classification set (train and test splits) as tensors.

    The image column is the first ``Image`` feature, the label column the first
    ``ClassLabel`` (or the one named in ``HUB_LABEL_KEYS``).
    """
    from datasets import ClassLabel, Image
    from flwr_datasets import FederatedDataset
    from flwr_datasets.partitioner import IidPartitioner

    # The partitioner is unused: Basin partitions the labels itself (see partitions/).
    fds = FederatedDataset(dataset=hub_id, partitioners={"train": IidPartitioner(1)}, shuffle=False)
    splits = {split: fds.load_split(split) for split in ("train", "test")}
    features = splits["train"].features
    image_key = next((k for k, f in features.items() if isinstance(f, Image)), None)
    label_key = HUB_LABEL_KEYS.get(hub_id) or next(
        (k for k, f in features.items() if isinstance(f, ClassLabel)), None
    )
    if image_key is None or label_key is None:
        raise ValueError(f"hub dataset {hub_id!r} needs an Image and a ClassLabel column; has {dict(features)}")

    fingerprint = digest(["hub", hub_id, image_key, label_key, *(splits[name]._fingerprint for name in ("train", "test"))])

    def decode() -> dict[str, np.ndarray]:
        def arrays(split):
            table = split.with_format("numpy", columns=[image_key, label_key])
            images = np.stack(list(table[image_key]))
            # grey scale (N, H, W), else (N, H, W, C): to (N, C, H, W)
            images = images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
            return images, np.asarray(table[label_key], dtype=np.int64)

        return _raw_arrays(*arrays(splits["train"]), *arrays(splits["test"]), features[label_key].num_classes, 255)

    return _scaled(f"hf:{hub_id}", cached_arrays("datasets", fingerprint, decode), fingerprint)
