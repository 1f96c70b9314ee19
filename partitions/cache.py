"""A disk cache of decoded data sets and built partitions, shared by every process of a run.

Every client process needs the training images and its partition's indices. Decoding them
(gunzip and parse Fashion-MNIST's IDX files; PNG-decode a hub set's images) and building
the partition (which imports flwr-datasets, seconds per process) used to be paid again by
each process of each run. The first process that needs an entry builds it and writes it
here; the others (and later runs) load it in milliseconds.

- Where: ``$BASIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/basin``, else ``~/.cache/basin``;
  ``BASIN_CACHE_DIR=off`` turns the cache off (every process decodes and builds again).
- Keys: an entry's name is a SHA-256 of everything its content depends on: a data set's
  source files' *contents* (so a replaced file is a new entry, never a stale one), and
  for a partition also its settings and the partitioners' source code.
- Format: one uncompressed ``.npz`` of plain arrays per entry, written to a temporary
  file and renamed into place, so concurrent writers and readers never see half a file.
  An unreadable entry is rebuilt and replaced. Entries are never deleted by Basin: remove
  the directory to reclaim the space (Fashion-MNIST: ~55 MB; CIFAR-10: ~185 MB).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

CACHE_ENV = "BASIN_CACHE_DIR"
CACHE_OFF = "off"


def cache_dir() -> Path | None:
    """The cache directory (not created here), or None when ``BASIN_CACHE_DIR=off``."""
    configured = os.environ.get(CACHE_ENV, "")
    if configured == CACHE_OFF:
        return None
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "basin"


def digest(parts: Iterable[str | bytes]) -> str:
    """SHA-256 (hex) of a sequence of strings and byte strings, each length-prefixed so
    that different sequences never collide by concatenation."""
    sha = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        sha.update(len(data).to_bytes(8, "little"))
        sha.update(data)
    return sha.hexdigest()


def file_digest(paths: Iterable[Path]) -> str:
    """SHA-256 over the contents of ``paths`` (in the order given)."""
    sha = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            sha.update(hashlib.file_digest(f, "sha256").digest())
    return sha.hexdigest()


def is_cached(kind: str, key: str) -> bool:
    """Whether entry ``kind/key`` is in the cache (a data set decoded completely before)."""
    directory = cache_dir()
    return directory is not None and (directory / kind / f"{key}.npz").is_file()


# The modules whose code decides which sample goes to which client: part of a cached
# partition's key, so changed partitioning code never reads an old entry.
PARTITIONER_SOURCES = (
    "base.py", "dirichlet.py", "client_dirichlet.py", "iid.py", "shards.py", "pachinko.py", "domains.py", "natural.py", "stats.py",
)


def cached_partition(fingerprint: str, settings: tuple, build: Callable[[], list[np.ndarray]]) -> list[np.ndarray]:
    """Every client's index array of the partition ``settings`` (as
    partitions.feasibility.partition_settings gives them) of the data set whose content
    is ``fingerprint``: loaded when cached, else ``build()`` and stored. The launcher's
    feasibility check, the ServerApp and the client processes share the entry.

    The entry is one ``.npy`` file, [K, K + 1 offsets, every client's indices], mapped into
    memory read-only: each client's array is a view of it, so a client process reads only
    the pages of the clients it trains, and every process of a run shares them (at 10,000
    clients of 300 samples, 24 MB that each process held in a copy of its own)."""
    code = Path(__file__).resolve().parent
    key = digest([fingerprint, repr(settings), *((code / name).read_bytes() for name in PARTITIONER_SOURCES)])
    directory = cache_dir()
    if directory is None:
        return build()
    path = directory / "partitions" / f"{key}.npy"
    try:
        return _unpack(np.load(path, mmap_mode="r", allow_pickle=False))
    except (OSError, ValueError, IndexError):
        pass  # not cached yet, or unreadable: build it (again)
    clients = build()
    packed = _pack(clients)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{key}-", suffix=".npy", delete=False) as tmp:
            np.save(tmp, packed)
        os.replace(tmp.name, path)
    except OSError:
        if "tmp" in locals():
            Path(tmp.name).unlink(missing_ok=True)
    return clients


def _pack(clients: list[np.ndarray]) -> np.ndarray:
    # Written into one array allocated once: the clients' indices are held once more, not
    # twice (at 10⁶ clients of 300 samples, each copy is 2.4 GB).
    count = len(clients)
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum([len(c) for c in clients], out=offsets[1:])
    packed = np.empty(count + 2 + int(offsets[-1]), dtype=np.int64)
    packed[0] = count
    packed[1:count + 2] = offsets
    indices = packed[count + 2:]
    for client, start, end in zip(clients, offsets[:-1], offsets[1:]):
        indices[start:end] = client
    return packed


def _unpack(packed: np.ndarray) -> list[np.ndarray]:
    """The client views of a packed partition (see cached_partition); ValueError when the
    file is not one."""
    if packed.ndim != 1 or packed.dtype != np.int64 or len(packed) < 2:
        raise ValueError("not a packed partition")
    count = int(packed[0])
    offsets = np.asarray(packed[1:count + 2])
    indices = packed[count + 2:]
    if count < 0 or len(offsets) != count + 1 or offsets[0] != 0 or offsets[-1] != len(indices) \
            or np.any(np.diff(offsets) < 0):
        raise ValueError("not a packed partition")
    # Plain ndarray views of the mapped file: slicing np.memmap runs its Python-level
    # __array_finalize__ per view (15 s of 10⁶ clients' views in a ServerApp).
    plain = indices.view(np.ndarray)
    return [plain[start:end] for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


def cached_arrays(kind: str, key: str, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The arrays of entry ``kind/key``: loaded when cached, else ``build()`` and stored.

    Without a usable cache directory (``off``, read-only, full disk) the arrays are built
    every time; caching only ever saves time, it never makes a run fail.
    """
    directory = cache_dir()
    if directory is None:
        return build()
    path = directory / kind / f"{key}.npz"
    try:
        with np.load(path, allow_pickle=False) as stored:
            return {name: stored[name] for name in stored.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        pass  # not cached yet, or unreadable: build it (again)
    arrays = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{key}-", suffix=".npz", delete=False) as tmp:
            np.savez(tmp, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle
        os.replace(tmp.name, path)
    except OSError:
        if "tmp" in locals():
            Path(tmp.name).unlink(missing_ok=True)
    return arrays


def raw_arrays(x_train, y_train, x_test, y_test, num_classes: int, max_value: int) -> dict[str, np.ndarray]:
    """Decoded splits as this cache stores them (uint8 images, int64 labels, the class count and largest pixel value)."""
    return {"x-train": np.ascontiguousarray(x_train, dtype=np.uint8), "y-train": np.asarray(y_train, dtype=np.int64),
            "x-test": np.ascontiguousarray(x_test, dtype=np.uint8), "y-test": np.asarray(y_test, dtype=np.int64),
            "num-classes": np.array(num_classes), "max-value": np.array(max_value)}
