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

Besides images and labels a hub set may carry the columns other partitions need (kept
in ``TensorDataset.columns``, per training sample): ``coarse_label`` (CIFAR-100's 20
superclasses: Pachinko allocation), ``domain`` (Digit-Five's digit sets, PACS's styles:
feature + label skew; also kept for the test split, for per-domain accuracy) and a natural
id, ``writer_id`` (FEMNIST), ``character_id`` (Shakespeare) or ``client_id``/``user_id``.
A set without a ``test`` split (the flwrlabs FEMNIST, Shakespeare and PACS sets) is split
here, seeded: 10 % of every natural id's samples (LEAF's per-client split) or, without
natural ids, 20 % of every domain's (of the whole set without domains) become the test set.
Images of mixed sizes or modes (Digit-Five) are converted to the first image's mode and size.

Text sets (string columns ``x`` and ``y``: LEAF's Shakespeare, an 80-character snippet
and the character after it) become a **next-character** task: the inputs are the
snippet's character ids, the targets the id of the character after each position
(``x[1:] + y``), so the model predicts at every position (FedJAX's Shakespeare task);
padded positions have the target :data:`IGNORE_INDEX`, which the loss and the accuracy
skip. Ids: 0 padding, 1 out of vocabulary, then LEAF's 80 characters (:data:`VOCABULARY`).
"""

from __future__ import annotations

import gzip
import importlib.util
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

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
# Targets with this value are not scored (PyTorch's cross-entropy default): padding.
IGNORE_INDEX = -100
# LEAF's Shakespeare characters (utils/language_utils.py ALL_LETTERS); id = position + 2.
VOCABULARY = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
PAD_ID, OOV_ID = 0, 1
SEQUENCE_LENGTH = 80
# Natural-id columns, in the order they are looked for.
NATURAL_ID_COLUMNS = ("writer_id", "character_id", "client_id", "user_id")
# Held-out share of a hub set without a test split: per natural id, else per domain.
NATURAL_TEST_FRACTION, DOMAIN_TEST_FRACTION = 0.1, 0.2


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
    # Per training sample: "coarse" labels, "domain" ids, "natural-id" codes (when the set has them).
    columns: Mapping[str, np.ndarray] = field(default_factory=dict)
    test_domains: np.ndarray | None = None  # the test split's domain ids
    domain_names: tuple[str, ...] = ()  # name of domain id d at position d

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def is_text(self) -> bool:
        """Token sequences (a next-character task), not images."""
        return not self.x_train.is_floating_point()


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
        return _scaled(name, *_load_fashion_mnist(data_dir))
    if name in HUB_ALIASES:
        return load_hub_dataset(HUB_ALIASES[name])
    if name.startswith("hf:"):
        return load_hub_dataset(name[3:])
    raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(BUILTIN_DATASETS)} or hf:<hub id>")


def _scaled(name: str, raw: dict[str, np.ndarray], fingerprint: str) -> TensorDataset:
    """Decoded arrays (partitions/cache.py's entry: uint8 images (N, C, H, W) with their
    largest value ``max-value``, int64 labels) as images scaled to [0, 1]."""
    scale = float(raw["max-value"])

    def inputs(split: str) -> torch.Tensor:
        if raw[f"x-{split}"].dtype != np.uint8:  # token ids
            return torch.from_numpy(raw[f"x-{split}"])
        # Torch's conversion (a copy: the decoded bytes may be read-only) and in-place division:
        # the values numpy's astype and / give, bit for bit, in a tenth of the time
        # (Fashion-MNIST: 0.1 s instead of 1.2 s per process).
        return torch.tensor(raw[f"x-{split}"], dtype=torch.float32).div_(scale)

    columns = {name: raw[f"{name}-train"] for name in ("coarse", "domain", "natural-id") if f"{name}-train" in raw}
    return TensorDataset(
        name, inputs("train"), torch.from_numpy(raw["y-train"]), inputs("test"), torch.from_numpy(raw["y-test"]),
        int(raw["num-classes"]), fingerprint=fingerprint, columns=columns,
        test_domains=raw.get("domain-test"), domain_names=tuple(str(n) for n in raw.get("domain-names", ())),
    )


def _raw_arrays(x_train, y_train, x_test, y_test, num_classes: int, max_value: int) -> dict[str, np.ndarray]:
    return {"x-train": np.ascontiguousarray(x_train, dtype=np.uint8), "y-train": np.asarray(y_train, dtype=np.int64),
            "x-test": np.ascontiguousarray(x_test, dtype=np.uint8), "y-test": np.asarray(y_test, dtype=np.int64),
            "num-classes": np.array(num_classes), "max-value": np.array(max_value)}


def local_fingerprint(name: str, data_dir: str = "") -> str | None:
    """The cache fingerprint (partitions/cache.py) of a built-in set read from local files,
    digits or Fashion-MNIST, from its files' contents without decoding them; None for
    other sets, or when the files are missing."""
    try:
        if name == "digits":
            return _digits_fingerprint()
        if name == "fashion-mnist":
            return _fashion_mnist_fingerprint(_fashion_mnist_files(data_dir))
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


def _fashion_mnist_files(data_dir: str) -> list[Path]:
    directory = Path(data_dir) if data_dir else FASHION_MNIST_DEFAULT_DIR
    return [_find_idx(directory, stem) for stem in IDX_STEMS]


def _fashion_mnist_fingerprint(files: list[Path]) -> str:
    return digest(["fashion-mnist", file_digest(files)])


def _load_fashion_mnist(data_dir: str) -> tuple[dict[str, np.ndarray], str]:
    files = _fashion_mnist_files(data_dir)
    fingerprint = _fashion_mnist_fingerprint(files)

    def decode() -> dict[str, np.ndarray]:
        x_train, y_train, x_test, y_test = (read_idx(path) for path in files)
        return _raw_arrays(x_train[:, None], y_train, x_test[:, None], y_test, 10, 255)

    return cached_arrays("datasets", fingerprint, decode), fingerprint


def load_hub_dataset(hub_id: str) -> TensorDataset:
    """Load a Hugging Face image-classification or next-character text set as tensors
    (see the module docstring for the columns read and the split of sets without a test split).

    The image column is the first ``Image`` feature, the label column the first
    ``ClassLabel`` (or the one named in ``HUB_LABEL_KEYS``); a text set has string columns
    ``x`` and ``y``.
    """
    from datasets import ClassLabel, Image
    from flwr_datasets import FederatedDataset
    from flwr_datasets.partitioner import IidPartitioner

    # The partitioner is unused: Basin partitions the labels itself (see partitions/).
    fds = FederatedDataset(dataset=hub_id, partitioners={"train": IidPartitioner(1)}, shuffle=False)
    splits = {"train": fds.load_split("train")}
    try:
        splits["test"] = fds.load_split("test")
    except ValueError:  # flwr-datasets' "split not present": held out below
        pass
    split_names = list(splits)
    features = splits["train"].features
    text = {"x", "y"} <= set(features) and all(getattr(features[k], "dtype", "") == "string" for k in ("x", "y"))
    image_key = next((k for k, f in features.items() if isinstance(f, Image)), None)
    label_key = HUB_LABEL_KEYS.get(hub_id) or next(
        (k for k, f in features.items() if isinstance(f, ClassLabel) and k not in ("coarse_label", "domain")), None
    )
    if not text and (image_key is None or label_key is None):
        raise ValueError(f"hub dataset {hub_id!r} needs an Image and a ClassLabel column, or string columns x and y; "
                         f"has {dict(features)}")
    id_key = next((k for k in NATURAL_ID_COLUMNS if k in features), None)
    side = [k for k in ("coarse_label", "domain") if k in features] + ([id_key] if id_key else [])
    # "hub-2": the decoding of side columns, text and held-out splits (older entries lack them).
    fingerprint = digest(["hub-2", hub_id, str(image_key), str(label_key), *side,
                          *(splits[name]._fingerprint for name in split_names)])

    def decode() -> dict[str, Any]:
        def columns(split) -> dict[str, Any]:
            read = ["x", "y"] if text else [str(image_key), str(label_key)]
            table = split.with_format("numpy", columns=read + side)
            # Images and strings as lists (images may differ in size), the rest as arrays.
            return {k: list(table[k]) if k in ("x", "y", image_key) else np.asarray(table[k]) for k in read + side}

        train = columns(splits["train"])
        test = columns(splits["test"]) if "test" in splits else None
        return _arrays_of(train, test, text, image_key, label_key, id_key, features)

    return _scaled(f"hf:{hub_id}", cached_arrays("datasets", fingerprint, decode), fingerprint)


def _arrays_of(train: dict, test: dict | None, text: bool, image_key, label_key, id_key, features) -> dict[str, np.ndarray]:
    """The cache entry of a hub set's decoded columns (test split held out when missing)."""
    has_domains = "domain" in train
    domain_names: list[str] = []
    if has_domains:
        feature = features["domain"]
        if hasattr(feature, "names"):  # a ClassLabel: its ids and names
            domain_names = list(feature.names)
        else:  # strings (flwrlabs/pacs) or integers: ids in sorted order of the values
            domain_names = [str(v) for v in sorted(set(np.asarray(train["domain"]).tolist()))]
            for split in (train, test) if test is not None else (train,):
                split["domain"] = np.array([domain_names.index(str(v)) for v in np.asarray(split["domain"]).tolist()],
                                           dtype=np.int64)
    if test is None:
        train, test = _hold_out(train, id_key)
    if text:
        x_train, y_train = encode_text(train["x"], train["y"])
        x_test, y_test = encode_text(test["x"], test["y"])
        raw = {"x-train": x_train, "y-train": y_train, "x-test": x_test, "y-test": y_test,
               "num-classes": np.array(len(VOCABULARY) + 2), "max-value": np.array(1)}
    else:
        # Mixed sets (Digit-Five) become the first training image's size, in colour if any image is.
        first = np.asarray(train[image_key][0])
        colour = any(np.ndim(image) == 3 for image in train[image_key])
        target = (first.shape[:2], colour)
        raw = _raw_arrays(*_images_and_labels(train, image_key, label_key, target),
                          *_images_and_labels(test, image_key, label_key, target), features[label_key].num_classes, 255)
    if "coarse_label" in train:
        raw["coarse-train"] = np.asarray(train["coarse_label"], dtype=np.int64)
    if has_domains:
        raw["domain-train"] = np.asarray(train["domain"], dtype=np.int64)
        raw["domain-test"] = np.asarray(test["domain"], dtype=np.int64)
        raw["domain-names"] = np.array(domain_names)
    if id_key:
        _, raw["natural-id-train"] = np.unique(np.asarray(train[id_key]).astype(str), return_inverse=True)
    return raw


def _images_and_labels(split: dict, image_key: str, label_key: str, target) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, C, H, W) and labels of a split; ``target`` = ((H, W), colour): images of
    another size or mode are converted to it (RGB when colour, else grey scale)."""
    (height, width), colour = target
    shape = (height, width, 3) if colour else (height, width)
    images = list(split[image_key])
    if any(np.shape(image) != shape for image in images):
        from PIL import Image as PILImage

        mode = "RGB" if colour else "L"
        images = [np.asarray(PILImage.fromarray(np.asarray(image)).convert(mode).resize((width, height))) for image in images]
    stacked = np.stack(images)
    # grey scale (N, H, W), else (N, H, W, C): to (N, C, H, W)
    stacked = stacked[:, None] if stacked.ndim == 3 else stacked.transpose(0, 3, 1, 2)
    return stacked, np.asarray(split[label_key], dtype=np.int64)


def _hold_out(train: dict, id_key: str | None) -> tuple[dict, dict]:
    """Split a set without a test split: a seeded share of every natural id's samples
    (or every domain's, or of the whole set) becomes the test split."""
    n = len(next(iter(train.values())))
    if id_key:
        groups, fraction = np.asarray(train[id_key]).astype(str), NATURAL_TEST_FRACTION
    elif "domain" in train:
        groups, fraction = np.asarray(train["domain"]), DOMAIN_TEST_FRACTION
    else:
        groups, fraction = np.zeros(n, dtype=np.int64), DOMAIN_TEST_FRACTION
    rng = np.random.default_rng(0)
    test_mask = np.zeros(n, dtype=bool)
    for group in np.unique(groups):
        members = rng.permutation(np.flatnonzero(groups == group))
        test_mask[members[: int(round(fraction * len(members)))]] = True

    def take(mask: np.ndarray) -> dict:
        chosen = np.flatnonzero(mask)
        return {k: (np.asarray(v)[chosen] if not isinstance(v, list) else [v[i] for i in chosen]) for k, v in train.items()}

    return take(~test_mask), take(test_mask)


def encode_text(snippets, next_characters) -> tuple[np.ndarray, np.ndarray]:
    """Character ids of each snippet (padded/cut to :data:`SEQUENCE_LENGTH`) and the ids of
    the character after each position (``x[1:] + y``; padding: :data:`IGNORE_INDEX`)."""
    lookup = {c: i + 2 for i, c in enumerate(VOCABULARY)}
    inputs = np.full((len(snippets), SEQUENCE_LENGTH), PAD_ID, dtype=np.int64)
    targets = np.full((len(snippets), SEQUENCE_LENGTH), IGNORE_INDEX, dtype=np.int64)
    for row, (snippet, after) in enumerate(zip(snippets, next_characters)):
        text = str(snippet)[-SEQUENCE_LENGTH:]
        following = (text + str(after))[1 : len(text) + 1]
        inputs[row, : len(text)] = [lookup.get(c, OOV_ID) for c in text]
        targets[row, : len(following)] = [lookup.get(c, OOV_ID) for c in following]
    return inputs, targets
