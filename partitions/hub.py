"""Hugging Face hub data sets through flwr-datasets: image classification (an ``Image`` and
a ``ClassLabel`` column) and next-character text (string columns ``x`` and ``y``), decoded
once into the suite's cache.

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
padded positions have the target ``IGNORE_INDEX``, which the loss and the accuracy
skip. Ids: 0 padding, 1 out of vocabulary, then LEAF's 80 characters (partitions/text.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from partitions.cache import cached_arrays, digest, raw_arrays
from partitions.tensor_dataset import TensorDataset, scaled_dataset
from partitions.text import VOCABULARY, encode_text

# Per data set, the label column to prefer when a hub set has several ClassLabels.
HUB_LABEL_KEYS = {"uoft-cs/cifar100": "fine_label"}

# Held-out share of a hub set without a test split: per natural id, else per domain.
NATURAL_TEST_FRACTION, DOMAIN_TEST_FRACTION = 0.1, 0.2
# Natural-id columns, in the order they are looked for.
NATURAL_ID_COLUMNS = ("writer_id", "character_id", "client_id", "user_id")


def load_hub_dataset(hub_id: str) -> TensorDataset:
    """Load a Hugging Face image-classification or next-character text set as tensors
    (see the module docstring for the columns read and the split of sets without a test split).

    The image column is the first ``Image`` feature, the label column the first
    ``ClassLabel`` (or the one named in ``HUB_LABEL_KEYS``); a text set has string columns
    ``x`` and ``y``. ``ID@REVISION`` pins the hub repository's revision (a commit, tag or branch).
    """
    from datasets import ClassLabel, Image
    from flwr_datasets import FederatedDataset
    from flwr_datasets.partitioner import IidPartitioner

    name, _, revision = hub_id.partition("@")
    pinned = {"revision": revision} if revision else {}
    # The partitioner is unused: Basin partitions the labels itself (see partitions/).
    fds = FederatedDataset(dataset=name, partitioners={"train": IidPartitioner(1)}, shuffle=False, **pinned)
    splits = {"train": fds.load_split("train")}
    try:
        splits["test"] = fds.load_split("test")
    except ValueError:  # flwr-datasets' "split not present": held out below
        pass
    split_names = list(splits)
    features = splits["train"].features
    text = {"x", "y"} <= set(features) and all(getattr(features[k], "dtype", "") == "string" for k in ("x", "y"))
    image_key = next((k for k, f in features.items() if isinstance(f, Image)), None)
    label_key = HUB_LABEL_KEYS.get(name) or next(
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

    return scaled_dataset(f"hf:{hub_id}", cached_arrays("datasets", fingerprint, decode), fingerprint)


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
        raw = raw_arrays(*_images_and_labels(train, image_key, label_key, target),
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
