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
  given as a path in ``hf:<path>``), or a next-character text set such as Shakespeare.

Hub sets are loaded by partitions/hub.py, next-character text encoded by
partitions/text.py.
"""

from __future__ import annotations

import gzip
import importlib.util
import struct
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from partitions.cache import cached_arrays, digest, file_digest, raw_arrays

if TYPE_CHECKING:
    import torch

    from partitions.tensor_dataset import TensorDataset

FASHION_MNIST_DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")
HUB_ALIASES = {"cifar10": "uoft-cs/cifar10", "cifar100": "uoft-cs/cifar100"}
# Fashion-MNIST's files, raw or .gz: train images and labels, test images and labels.
IDX_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
BUILTIN_DATASETS = ("digits", "fashion-mnist", *HUB_ALIASES)
# Input shape (C, H, W) of the built-in sets, known without loading them (config checks).
# The hub sets of next-character text that Basin's presets name (wima-shakespeare): their kind
# is known before they load, so the launcher checks a model against it.
TEXT_DATASETS = ("hf:flwrlabs/shakespeare",)
INPUT_SHAPES = {"digits": (1, 8, 8), "fashion-mnist": (1, 28, 28), "cifar10": (3, 32, 32), "cifar100": (3, 32, 32)}
NUM_CLASSES = {"digits": 10, "fashion-mnist": 10, "cifar10": 10, "cifar100": 100}


def dataset_shape(name: str, data_dir: str = "", normalize: bool = True) -> tuple[int, tuple[int, ...]]:
    """(number of classes, input shape) of a data set: known without reading it for the
    built-in sets (a server that holds no data: ``evaluation = federated``), else read."""
    if name in NUM_CLASSES:
        return NUM_CLASSES[name], INPUT_SHAPES[name]
    data = load_dataset(name, data_dir, normalize)
    return data.num_classes, data.input_shape


def is_known_dataset(name: str) -> bool:
    return name in BUILTIN_DATASETS or (name.startswith("hf:") and len(name) > 3)


@lru_cache(maxsize=4)
def load_dataset(name: str, data_dir: str = "", normalize: bool = True) -> TensorDataset:
    """Load a data set by name (cached per process: clients load it once): images scaled to
    [0, 1], then, with ``normalize``, standardised per channel with the training split's
    mean and std (the IMA authors' Fashion-MNIST is only scaled: ``normalize = false``)."""
    data = _load_scaled(name, data_dir)
    if data.is_text:
        return data
    if not normalize:
        return replace(data, black=(0.0,) * data.input_shape[0])
    mean, std = channel_statistics(data.x_train)
    black = tuple(float(v) for v in (-mean / std).flatten())
    # In place: the scaled images are this call's own (not cached), and a copy costs a
    # fresh allocation per process (~0.3 s for Fashion-MNIST).
    return replace(data, x_train=data.x_train.sub_(mean).div_(std), x_test=data.x_test.sub_(mean).div_(std), black=black)


def channel_statistics(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std (float32, shape (1, C, 1, 1)) of images ``x`` (N, C, H, W):
    what :func:`load_dataset` standardises by, and what a written node folder records."""
    dims = (0, 2, 3)
    return x.mean(dim=dims, keepdim=True), x.std(dim=dims, keepdim=True).clamp_min(1e-8)


def _load_scaled(name: str, data_dir: str) -> TensorDataset:
    # Not cached: load_dataset caches its result, so a process holds one copy of the images
    # (standardised or not), not also the scaled one it was computed from.
    from partitions.tensor_dataset import scaled_dataset  # torch: not for the launcher's checks

    if name == "digits":
        return scaled_dataset(name, *_load_digits())
    if name == "fashion-mnist":
        return scaled_dataset(name, *_load_fashion_mnist(data_dir))
    from partitions.hub import load_hub_dataset  # imports flwr-datasets: only for a hub set

    if name in HUB_ALIASES:
        return load_hub_dataset(HUB_ALIASES[name])
    if name.startswith("hf:"):
        return load_hub_dataset(name[3:])
    raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(BUILTIN_DATASETS)} or hf:<hub id>")


def local_fingerprint(name: str, data_dir: str = "") -> str | None:
    """The cache fingerprint (partitions/cache.py) of a built-in set read from local files,
    digits or Fashion-MNIST, from its files' contents without decoding them; None for
    other sets, or when the files are missing."""
    try:
        if name == "digits":
            return _digits_fingerprint()
        if name == "fashion-mnist":
            return _fashion_mnist_fingerprint(fashion_mnist_files(data_dir))
    except FileNotFoundError:
        pass
    return None


def _digits_fingerprint() -> str:
    # The bundled file is found without importing scikit-learn (a second of start-up).
    package = importlib.util.find_spec("sklearn")
    if package is None or not package.submodule_search_locations:
        raise ModuleNotFoundError("scikit-learn, which ships the digits data set, is not installed")
    source = Path(next(iter(package.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    return digest(["digits", file_digest([source])])


def digits_labels() -> np.ndarray:
    """The digits training labels (int64), as ``load_dataset("digits").y_train`` holds them, without torch."""
    return _load_digits()[0]["y-train"]


def _load_digits() -> tuple[dict[str, np.ndarray], str]:
    fingerprint = _digits_fingerprint()
    return cached_arrays("datasets", fingerprint, _decode_digits), fingerprint


def _decode_digits() -> dict[str, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = bunch.images.astype(np.uint8)[:, None]  # values 0..16
    order = np.random.default_rng(0).permutation(len(bunch.target))
    num_test = len(order) // 5
    test, train = order[:num_test], order[num_test:]
    return raw_arrays(images[train], bunch.target[train], images[test], bunch.target[test], 10, 16)


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


def fashion_mnist_files(data_dir: str) -> list[Path]:
    """Fashion-MNIST's four IDX files (IDX_STEMS' order, each gzipped or not) in ``data_dir``,
    or in the Debian package's folder where it is empty; FileNotFoundError naming the first missing."""
    directory = Path(data_dir) if data_dir else FASHION_MNIST_DEFAULT_DIR
    return [_find_idx(directory, stem) for stem in IDX_STEMS]


def _fashion_mnist_fingerprint(files: list[Path]) -> str:
    return digest(["fashion-mnist", file_digest(files)])


def _load_fashion_mnist(data_dir: str) -> tuple[dict[str, np.ndarray], str]:
    files = fashion_mnist_files(data_dir)
    fingerprint = _fashion_mnist_fingerprint(files)

    def decode() -> dict[str, np.ndarray]:
        x_train, y_train, x_test, y_test = (read_idx(path) for path in files)
        return raw_arrays(x_train[:, None], y_train, x_test[:, None], y_test, 10, 255)

    return cached_arrays("datasets", fingerprint, decode), fingerprint


