"""Whether a run's data can be loaded, checked before any Flower or Ray process starts.

A missing Fashion-MNIST directory, an unreadable or truncated IDX file, or a hub data set
that cannot be reached would otherwise fail inside the ServerApp after ~45 s of start-up,
and once per run of a sweep. :func:`data_problem` answers in about a second:

- ``digits``: bundled with scikit-learn, always there.
- ``fashion-mnist``: the directory exists and its four IDX files (raw or ``.gz``) are
  readable and complete (the header's dimensions match the payload; a truncated ``.gz``
  is named). Files whose exact contents are in the decoded-data cache
  (partitions/cache.py) decoded completely before and are not read again.
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

from partitions.cache import is_cached
from partitions.datasets import FASHION_MNIST_DEFAULT_DIR, HUB_ALIASES, IDX_STEMS, local_fingerprint

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
    if is_cached("datasets", local_fingerprint("fashion-mnist", directory)):
        return None  # these very contents were decoded completely before
    for path in paths:
        problem = _idx_problem(path)
        if problem:
            return f"Fashion-MNIST file {path} {problem}"
    return None


def _idx_problem(path: Path) -> str | None:
    """None when the IDX file reads completely, else what is wrong with it."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            data = f.read()
    except PermissionError:
        return "cannot be read (permission denied)"
    except (EOFError, gzip.BadGzipFile, OSError) as error:
        return f"is truncated or corrupt ({type(error).__name__}: {error}); download it again"
    if len(data) < 4:
        return "is truncated (no IDX header)"
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08 or len(data) < 4 + 4 * ndim:
        return "is not an unsigned-byte IDX file"
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    payload = 1
    for side in shape:
        payload *= side
    if len(data) != 4 + 4 * ndim + payload:
        return f"is truncated: its header promises {payload} values, it holds {len(data) - 4 - 4 * ndim}"
    return None


@lru_cache(maxsize=16)
def _hub_problem(hub_id: str) -> str | None:
    if Path(hub_id).expanduser().exists():
        return None
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    cache = Path(os.environ.get("HF_DATASETS_CACHE", home / "datasets"))
    # The datasets library's cache, or the hub client's download cache.
    if (cache / hub_id.replace("/", "___")).exists() or (home / "hub" / f"datasets--{hub_id.replace('/', '--')}").exists():
        return None
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
