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
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import overload

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


def cached_partition(fingerprint: str, settings: tuple,
                     build: Callable[[], list[np.ndarray]]) -> Sequence[np.ndarray]:
    """Every client's index array of the partition ``settings`` (as
    partitions.feasibility.partition_settings gives them) of the data set whose content
    is ``fingerprint``: loaded when cached (a :class:`MappedPartition`), else ``build()``
    and stored. The launcher's feasibility check, the ServerApp and the client processes
    share the entry.

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
        return MappedPartition(np.load(path, mmap_mode="r", allow_pickle=False))
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


class MappedPartition(Sequence[np.ndarray]):
    """The clients' index arrays of a cached partition (see cached_partition): each a
    read-only plain ``ndarray`` view of the mapped entry, made when it is asked for.

    Made lazily, a process holds no per-client object it does not use: at 10⁶ clients the
    views alone were ~160 MB in the ServerApp and in every client process. Slicing
    ``np.memmap`` itself runs a Python-level ``__array_finalize__`` per view (15 s for 10⁶
    views), so the views are of a plain ``ndarray`` of the same mapping.

    :meth:`blocks` reads every client's indices from the file in blocks, without mapping
    them: a pass over all clients (the class counts) through the views would leave the
    whole entry (2.4 GB at 10⁶ clients of 300 samples) resident in the process.
    """

    def __init__(self, packed: np.memmap):
        """ValueError when ``packed`` is not a packed partition."""
        if packed.filename is None or packed.ndim != 1 or packed.dtype != np.int64 or len(packed) < 2:
            raise ValueError("not a packed partition")
        count = int(packed[0])
        offsets = np.array(packed[1:count + 2])
        indices = packed[count + 2:]
        if count < 0 or len(offsets) != count + 1 or offsets[0] != 0 or offsets[-1] != len(indices) \
                or np.any(np.diff(offsets) < 0):
            raise ValueError("not a packed partition")
        self.offsets = offsets
        self._indices = indices.view(np.ndarray)
        self._path = Path(packed.filename)
        self._first_index_byte = packed.offset + (count + 2) * packed.itemsize

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, client: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, client: slice) -> list[np.ndarray]: ...

    def __getitem__(self, client: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(client, slice):
            return [self[i] for i in range(*client.indices(len(self)))]
        if not -len(self) <= client < len(self):
            raise IndexError(f"client {client} of a partition of {len(self)} clients")
        client %= len(self)
        return self._indices[self.offsets[client]:self.offsets[client + 1]]

    def sizes(self) -> np.ndarray:
        """Every client's sample count."""
        return np.diff(self.offsets)

    def blocks(self, max_samples: int) -> Iterator[tuple[slice, np.ndarray]]:
        """(a run of consecutive clients, their indices one after another) for every client
        in order, each block read from the file (not mapped) and holding at most
        ``max_samples`` indices unless one client holds more."""
        with open(self._path, "rb") as file:
            for clients in client_runs(self.sizes(), max_samples):
                start, end = int(self.offsets[clients.start]), int(self.offsets[clients.stop])
                file.seek(self._first_index_byte + start * self._indices.itemsize)
                indices = np.fromfile(file, dtype=np.int64, count=end - start)
                if len(indices) != end - start:
                    raise ValueError(f"{self._path} is shorter than its partition says")
                yield clients, indices


def partition_sizes(indices: Sequence[np.ndarray]) -> np.ndarray:
    """Every client's sample count (of a MappedPartition without making its views)."""
    if isinstance(indices, MappedPartition):
        return indices.sizes()
    return np.array([len(index) for index in indices], dtype=np.int64)


def client_runs(sizes: np.ndarray, max_samples: int) -> Iterator[slice]:
    """Consecutive runs of clients (slices), in order, whose ``sizes`` sum to at most
    ``max_samples`` each, except a run of one client larger than that."""
    ends = np.cumsum(sizes)
    start = 0
    while start < len(sizes):
        before = int(ends[start - 1]) if start else 0
        stop = max(int(np.searchsorted(ends, before + max_samples, side="right")), start + 1)
        yield slice(start, stop)
        start = stop


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
