"""A node's own data: the folder or file a SuperNode's node config names (``data-path``),
read into the arrays Basin trains on, with Hugging Face ``datasets`` reading each format:

- a folder ``datasets.save_to_disk`` wrote (a ``Dataset``, or a ``DatasetDict`` with ``train``
  and optionally ``test``), as ``flwr-datasets create`` and ``experiments.write_partitions`` do;
- a class-per-folder image folder (``<class>/<image>``, or ``train/<class>/…`` and
  ``test/<class>/…``), each class folder named by its class index (0, 1, …): a node may lack
  classes, so a folder's rank among its siblings is no label;
- a Parquet or CSV file (or ``train`` and ``test`` files of one format in a folder) with an
  image column (images, or in a CSV paths relative to the file) and an integer label column,
  or string columns ``x`` and ``y`` of next-character text.

Images become uint8 (N, C, H, W) with their largest value ``max-value`` (255, or what the
writer recorded); ``basin-node.json`` beside the data, which experiments.write_partitions
writes, may say more: the scale, the federation's per-channel mean and std, the partition
id and the data set it came from. Anything that cannot be read is a :class:`NodeDataError`
naming the path and what is wrong.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from partitions.text import encode_text

NODE_FILE = "basin-node.json"  # what a written node folder says of itself
NODE_FOLDER = "node-{}"  # experiments.write_partitions' folder of partition K
IMAGE_COLUMNS = ("image", "img", "pixels")
LABEL_COLUMNS = ("label", "labels", "target")
TABLE_FORMATS = {".parquet": "parquet", ".csv": "csv"}


class NodeDataError(ValueError):
    """A node's data cannot be used: the line names the path and what is wrong."""


@dataclass
class NodeData:
    """One node's data as arrays: inputs (uint8 images (N, C, H, W), or token ids (N, T)) and
    int64 labels of its training split and, where the data has one, its own test split."""

    path: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    max_value: int = 255
    described: dict[str, Any] = field(default_factory=dict)  # basin-node.json's entries

    @property
    def is_text(self) -> bool:
        return self.x_train.dtype != np.uint8

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    def check_fits(self, num_classes: int, input_shape: tuple[int, ...] | None) -> None:
        """NodeDataError unless every label is a class of the run's and the inputs have its shape."""
        for name, labels in (("training", self.y_train), ("test", self.y_test)):
            scored = labels[labels >= 0] if labels is not None else np.zeros(0, dtype=np.int64)
            if len(scored) and int(scored.max()) >= num_classes:
                raise NodeDataError(f"node data {self.path}: its {name} split holds label {int(scored.max())}, but the "
                                    f"run has {num_classes} classes (labels 0..{num_classes - 1})")
        if input_shape is not None and self.input_shape != tuple(input_shape):
            raise NodeDataError(f"node data {self.path}: its inputs have shape {self.input_shape}, the run's model takes "
                                f"{tuple(input_shape)}")


def node_description(path: str) -> dict[str, Any]:
    """basin-node.json of the node folder at ``path``; NodeDataError without one."""
    file = Path(path) / NODE_FILE
    if not file.is_file():
        raise NodeDataError(f"node data {path}: has no {NODE_FILE} (experiments.write_partitions writes it) and the "
                            f"node config no partition-id; give the SuperNode --node-config 'partition-id=K "
                            f"num-partitions=N data-path={path}'")
    return json.loads(file.read_text())


def load_node_data(path: str | Path) -> NodeData:
    """Read the data at ``path`` (see the module docstring); NodeDataError where it cannot."""
    root = Path(path)
    if not root.exists():
        raise NodeDataError(f"node data {root}: no such file or folder")
    described = json.loads((root / NODE_FILE).read_text()) if root.is_dir() and (root / NODE_FILE).exists() else {}
    try:
        splits = _read_splits(root)
        train, test = splits.get("train"), splits.get("test")
        if train is None or len(train) == 0:
            raise NodeDataError(f"node data {root}: holds no training examples")
        x_train, y_train = _arrays(root, train)
        x_test, y_test = _arrays(root, test) if test is not None and len(test) else (None, None)
    except NodeDataError:
        raise
    except Exception as error:  # an unreadable image, a malformed table: the reader's own words, on one line
        reason = " ".join(str(error).split())
        raise NodeDataError(f"node data {root}: cannot be read: {type(error).__name__}: {reason}") from error
    return NodeData(str(root), x_train, y_train, x_test, y_test, int(described.get("max-value", 255)), described)


def _read_splits(root: Path) -> dict[str, Any]:
    """{"train": Dataset, "test": Dataset (where there is one)} of the data at ``root``."""
    import datasets

    datasets.disable_progress_bars()
    if root.is_file():
        return _read_tables(root, {"train": root})
    if (root / "dataset_dict.json").exists() or (root / "state.json").exists():
        loaded = datasets.load_from_disk(str(root))
        return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
    tables = {split: file for split in ("train", "test") for file in root.glob(f"{split}.*")
              if file.suffix in TABLE_FORMATS}
    if tables:
        return _read_tables(root, tables)
    entries = [entry for entry in root.iterdir() if entry.name != NODE_FILE and not entry.name.startswith(".")]
    if not entries:
        raise NodeDataError(f"node data {root}: the folder is empty")
    split_roots = {split: root / split for split in ("train", "test") if (root / split).is_dir()} or {"train": root}
    return {split: _image_folder(folder) for split, folder in split_roots.items()}


def _read_tables(root: Path, files: dict[str, Path]) -> dict[str, Any]:
    import datasets

    formats = {TABLE_FORMATS.get(file.suffix) for file in files.values()}
    if None in formats or len(formats) != 1:
        raise NodeDataError(f"node data {root}: files {sorted(f.name for f in files.values())}; allowed: .parquet or "
                            f".csv files of one format")
    # The tables are read into memory: nothing is cached beside the node's data or in the home folder.
    with tempfile.TemporaryDirectory() as cache:
        loaded = datasets.load_dataset(formats.pop(), data_files={split: str(file) for split, file in files.items()},
                                       cache_dir=cache, keep_in_memory=True)
    splits = dict(loaded)
    for split, table in splits.items():
        column = next((c for c in IMAGE_COLUMNS if c in table.column_names), None)
        if column is not None and getattr(table.features[column], "dtype", "") in ("string", "large_string"):  # paths
            base = files[split].parent
            splits[split] = table.map(lambda row, c=column: {c: str(base / row[c])}, keep_in_memory=True) \
                .cast_column(column, datasets.Image())
    return splits


def _image_folder(folder: Path) -> Any:
    """A class-per-folder split: each subfolder named by its class index."""
    import datasets

    classes = sorted(entry for entry in folder.iterdir() if entry.is_dir())
    loose = [entry.name for entry in folder.iterdir() if entry.is_file() and entry.name != NODE_FILE]
    if not classes or loose:
        raise NodeDataError(f"node data {folder}: expected one folder per class (named 0, 1, …) holding its images; "
                            f"found {'files ' + ', '.join(sorted(loose)[:3]) if loose else 'no class folders'}")
    bad = [entry.name for entry in classes if not entry.name.isdigit()]
    if bad:
        raise NodeDataError(f"node data {folder}: class folder(s) {', '.join(bad[:3])} are not class indices; name each "
                            f"class's folder by its index (0, 1, …): a node may lack classes, so their order is no label")
    files = [(str(image), int(entry.name)) for entry in classes for image in sorted(entry.iterdir()) if image.is_file()]
    if not files:
        raise NodeDataError(f"node data {folder}: its class folders hold no images")
    table = datasets.Dataset.from_dict({"image": [f for f, _ in files], "label": [label for _, label in files]})
    return table.cast_column("image", datasets.Image())


def _arrays(root: Path, table: Any) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels) of one split: uint8 (N, C, H, W) images and int64 labels, or text's
    token ids and next-character targets."""
    features, columns = table.features, table.with_format("numpy")[:]
    if {"x", "y"} <= set(columns) and getattr(features["x"], "dtype", "") in ("string", "large_string"):
        return encode_text(list(columns["x"]), list(columns["y"]))
    image = next((c for c in IMAGE_COLUMNS if c in columns), None)
    label = next((c for c in LABEL_COLUMNS if c in columns), None)
    if image is None or label is None:
        raise NodeDataError(f"node data {root}: needs an image column ({', '.join(IMAGE_COLUMNS)}) and a label column "
                            f"({', '.join(LABEL_COLUMNS)}), or string columns x and y; has {', '.join(columns)}")
    labels = np.asarray(columns[label])
    if not np.issubdtype(labels.dtype, np.integer) or (len(labels) and int(labels.min()) < 0):
        raise NodeDataError(f"node data {root}: its labels ({label}) must be class indices 0, 1, …; got "
                            f"{labels[:3].tolist()}")
    images = [np.asarray(value) for value in columns[image]]
    shapes = {value.shape for value in images}
    if len(shapes) != 1:
        raise NodeDataError(f"node data {root}: its images differ in shape ({', '.join(map(str, sorted(shapes)[:3]))}); "
                            f"allowed: one shape for every image")
    stacked = np.stack(images)
    if stacked.ndim == 4 and stacked.shape[-1] in (1, 3) and stacked.shape[1] not in (1, 3):
        stacked = stacked.transpose(0, 3, 1, 2)  # (N, H, W, C), as images decode, to (N, C, H, W)
    elif stacked.ndim == 3:
        stacked = stacked[:, None]
    if stacked.dtype != np.uint8:  # integer pixels as a table stores them; anything else is no 8-bit image
        if not np.issubdtype(stacked.dtype, np.integer) or stacked.min() < 0 or stacked.max() > 255:
            raise NodeDataError(f"node data {root}: its images are {stacked.dtype} in "
                                f"[{stacked.min()}, {stacked.max()}]; allowed: 8-bit images (0..255)")
        stacked = stacked.astype(np.uint8)
    return np.ascontiguousarray(stacked), labels.astype(np.int64)
