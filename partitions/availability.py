"""Whether a run's data can be loaded, checked before any Flower or Ray process starts.

A missing Fashion-MNIST directory, an unreadable or truncated IDX file, or a hub data set
that cannot be reached would otherwise fail inside the ServerApp after ~45 s of start-up,
and once per run of a sweep. :func:`data_problem` answers in about a second:

- ``digits``: bundled with scikit-learn, always there.
- ``fashion-mnist``: the directory exists and its four IDX files (raw or ``.gz``) are
  readable and whole: gzip where named ``.gz``, an unsigned-byte IDX header, exactly the
  payload the header promises (a truncated file, or one with trailing bytes, is named);
  images of 28×28, labels a vector of classes 0–9, as many labels as images in each split.
  Files whose exact contents are in the decoded-data cache (partitions/cache.py) decoded completely before and are not read again.
- ``cifar10``, ``cifar100``, ``hf:<id>``: a local path, or a copy in the Hugging Face
  datasets cache, or the hub answering for the id within a few seconds (offline, the
  message says so and how to use a local copy).
"""

from __future__ import annotations

import gzip
import os
import struct
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from partitions.cache import is_cached
from partitions.datasets import FASHION_MNIST_DEFAULT_DIR, HUB_ALIASES, IDX_STEMS, local_fingerprint

if TYPE_CHECKING:  # numpy is imported where the values are read
    import numpy as np

HUB_TIMEOUT_S = 5.0


def data_problem(dataset: str, data_dir: str = "") -> str | None:
    """Why the data set cannot be loaded here, or None when it can."""
    if dataset == "fashion-mnist":
        directory = (Path(data_dir) if data_dir else FASHION_MNIST_DEFAULT_DIR).expanduser().resolve()
        return _fashion_mnist_problem(str(directory), _files_signature(directory))
    if dataset in HUB_ALIASES or dataset.startswith("hf:"):
        return _hub_problem(HUB_ALIASES.get(dataset, dataset.removeprefix("hf:")))
    return None


def _files_signature(directory: Path) -> tuple:
    """(name, size, mtime) of the IDX files present: a cached answer holds until one changes."""
    signature = []
    for stem in IDX_STEMS:
        for path in (directory / stem, directory / f"{stem}.gz"):
            try:
                stat = path.stat()
            except OSError:
                continue
            signature.append((path.name, stat.st_size, stat.st_mtime_ns))
    return tuple(signature)


@lru_cache(maxsize=8)
def _fashion_mnist_problem(directory: str, signature: tuple) -> str | None:
    root = Path(directory)
    hint = "install the Debian package dataset-fashion-mnist or set data-dir to a directory holding the IDX files"
    if not root.is_dir():
        return f"Fashion-MNIST directory {root} does not exist; {hint}"
    paths = []
    for stem in IDX_STEMS:
        path = next((p for p in (root / stem, root / f"{stem}.gz") if p.is_file()), None)
        if path is None:
            return f"Fashion-MNIST file {stem}[.gz] is missing from {root}; {hint}"
        paths.append(path)
    if is_cached("datasets", local_fingerprint("fashion-mnist", directory) or ""):
        return None  # these very contents were decoded completely before
    shapes: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for path in paths:
        problem, shape, labels = _idx_problem(path)
        if problem:
            return f"Fashion-MNIST file {path} {problem}"
        if "labels" in path.name:
            if len(shape) != 1:
                return f"Fashion-MNIST file {path} holds an array of shape {shape}; a labels file holds a vector"
            if labels is not None and labels.max(initial=0) >= FASHION_MNIST_CLASSES:
                return (f"Fashion-MNIST file {path} holds label {int(labels.max())}, outside the "
                        f"{FASHION_MNIST_CLASSES} classes 0–{FASHION_MNIST_CLASSES - 1}")
        elif shape[1:] != FASHION_MNIST_SIDE:
            return f"Fashion-MNIST file {path} holds images of {'×'.join(map(str, shape[1:]))}, not 28×28"
        shapes[path.name.split("-")[0] + ("-labels" if "labels" in path.name else "-images")] = (path, shape)
    for split in ("train", "t10k"):
        (image_file, image_shape), (label_file, label_shape) = shapes[f"{split}-images"], shapes[f"{split}-labels"]
        if image_shape[0] != label_shape[0]:
            return (f"Fashion-MNIST files {image_file.name} and {label_file.name} in {root} disagree: {image_shape[0]} images "
                    f"but {label_shape[0]} labels; download both again")
    return None


FASHION_MNIST_CLASSES = 10
FASHION_MNIST_SIDE = (28, 28)


def _idx_problem(path: Path) -> tuple[str | None, tuple[int, ...], np.ndarray | None]:
    """(what is wrong with the IDX file or None, its shape, its values when it is a vector)."""
    import numpy as np

    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            data = f.read()
    except PermissionError:
        return "cannot be read (permission denied)", (), None
    except gzip.BadGzipFile:
        return "is not gzip data although named .gz; download it again", (), None
    except (EOFError, OSError) as error:
        return f"is truncated or corrupt ({type(error).__name__}: {error}); download it again", (), None
    if len(data) < 4:
        return ("is empty" if not data else "is truncated (no IDX header)"), (), None
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08 or not 1 <= ndim <= 4 or len(data) < 4 + 4 * ndim:
        return f"is not an unsigned-byte IDX file (magic number {data[:4].hex()}, expected 000008nn)", (), None
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    payload = 1
    for side in shape:
        payload *= side
    held = len(data) - 4 - 4 * ndim
    if held < payload:
        return f"is truncated: its header promises {payload} values, it holds {held}; download it again", shape, None
    if held > payload:
        return f"has {held - payload} bytes after the {payload} values its header promises", shape, None
    values = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim) if ndim == 1 else None
    return None, shape, values


@lru_cache(maxsize=16)
def _hub_problem(hub_id: str) -> str | None:
    if Path(hub_id).expanduser().exists():
        return _hub_content_problem(hub_id)
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    cache = Path(os.environ.get("HF_DATASETS_CACHE", home / "datasets"))
    # The datasets library's cache, or the hub client's download cache.
    if (cache / hub_id.replace("/", "___")).exists() or (home / "hub" / f"datasets--{hub_id.replace('/', '--')}").exists():
        return _hub_content_problem(hub_id)
    if os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1":
        return f"hub data set {hub_id!r} is not in the local cache {cache} and the hub is switched off (HF_*_OFFLINE=1)"
    try:
        from huggingface_hub import HfApi

        HfApi().dataset_info(hub_id, timeout=HUB_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001 — any failure means: cannot be loaded from here
        return (
            f"hub data set {hub_id!r} cannot be reached ({type(error).__name__}); without the network, "
            f"give a local copy as dataset = 'hf:/path/to/copy' or fill the datasets cache {cache}"
        )
    return None


def _hub_content_problem(hub_id: str) -> str | None:
    """A hub set on this machine, decoded once (into the cache the ServerApp and the client
    processes then read, so no work is done twice): what makes it unusable (no train
    split, no image and label columns of the right types, an empty split), or None."""
    import datasets

    from partitions.hub import load_hub_dataset

    datasets.disable_progress_bars()  # the launcher's check prints one line, not the library's bars
    try:
        data = load_hub_dataset(hub_id)
    except Exception as error:  # noqa: BLE001 — the library's words, on one line, with the set's name
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"hub data set {hub_id!r} cannot be used: {reason}"
    for split, labels in (("train", data.y_train), ("test", data.y_test)):
        if len(labels) == 0:
            return f"hub data set {hub_id!r} has an empty {split} split; allowed: a split with samples"
    return None
