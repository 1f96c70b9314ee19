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
import struct
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

FASHION_MNIST_DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")
HUB_ALIASES = {"cifar10": "uoft-cs/cifar10", "cifar100": "uoft-cs/cifar100"}
# Per data set, the label column to prefer when a hub set has several ClassLabels.
HUB_LABEL_KEYS = {"uoft-cs/cifar100": "fine_label"}
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
    return replace(data, x_train=(data.x_train - mean) / std, x_test=(data.x_test - mean) / std, black=black)


def _load_scaled(name: str, data_dir: str) -> TensorDataset:
    # Not cached: load_dataset caches its result, so a process holds one copy of the images
    # (standardised or not), not also the scaled one it was computed from.
    if name == "digits":
        return _load_digits()
    if name == "fashion-mnist":
        return _load_fashion_mnist(Path(data_dir) if data_dir else FASHION_MNIST_DEFAULT_DIR)
    if name in HUB_ALIASES:
        return load_hub_dataset(HUB_ALIASES[name])
    if name.startswith("hf:"):
        return load_hub_dataset(name[3:])
    raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(BUILTIN_DATASETS)} or hf:<hub id>")


def _load_digits() -> TensorDataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.int64)
    order = torch.from_numpy(np.random.default_rng(0).permutation(len(y)))
    num_test = len(y) // 5
    test, train = order[:num_test], order[num_test:]
    return TensorDataset("digits", x[train], y[train], x[test], y[test], 10)


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


def _load_fashion_mnist(directory: Path) -> TensorDataset:
    arrays = {
        split: (
            read_idx(_find_idx(directory, f"{prefix}-images-idx3-ubyte")),
            read_idx(_find_idx(directory, f"{prefix}-labels-idx1-ubyte")),
        )
        for split, prefix in (("train", "train"), ("test", "t10k"))
    }
    (xtr, ytr), (xte, yte) = arrays["train"], arrays["test"]
    x_train = torch.from_numpy(xtr.astype(np.float32) / 255.0).unsqueeze(1)
    x_test = torch.from_numpy(xte.astype(np.float32) / 255.0).unsqueeze(1)
    return TensorDataset(
        "fashion-mnist", x_train, torch.from_numpy(ytr.astype(np.int64)),
        x_test, torch.from_numpy(yte.astype(np.int64)), 10,
    )


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

    def to_tensors(split):
        table = split.with_format("numpy", columns=[image_key, label_key])
        images = np.stack(list(table[image_key])).astype(np.float32) / 255.0
        if images.ndim == 3:  # grey scale (N, H, W)
            images = images[:, None]
        else:  # (N, H, W, C)
            images = images.transpose(0, 3, 1, 2)
        return torch.from_numpy(np.ascontiguousarray(images)), torch.from_numpy(
            np.asarray(table[label_key], dtype=np.int64)
        )

    x_train, y_train = to_tensors(splits["train"])
    x_test, y_test = to_tensors(splits["test"])
    num_classes = features[label_key].num_classes
    return TensorDataset(f"hf:{hub_id}", x_train, y_train, x_test, y_test, num_classes)
