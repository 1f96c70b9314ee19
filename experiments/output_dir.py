"""Output directories: created before Flower starts, one launcher at a time, unique names.

A launcher holds ``<directory>/.basin.lock`` locked (``fcntl.flock``) for as long as it
writes there; the file's text is the holder's PID. A second launcher on the same
directory is refused at once, naming that PID. The kernel drops a lock when its holder
dies, however it dies, so the lock file a dead launcher left behind is simply taken over;
the summaries it left saying ``running`` are then marked ``killed``. Locks belong to a
process: a launcher that holds a directory may lock it again (a run's folder inside its
job's), and threads of one process are not kept apart.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import threading
import time
from pathlib import Path

from strategies.results import write_json_atomic

LOCK_FILE = ".basin.lock"

# {directory: [file descriptor holding the lock, nesting depth]} of this process.
_held: dict[Path, list[int]] = {}
_held_guard = threading.Lock()


class OutputDirError(ValueError):
    """An output directory that cannot be created, written or locked."""


class OutputLocked(OutputDirError):
    """Another launcher is writing into the output directory."""


def create_output_dir(path: Path, option: str = "--out") -> Path:
    """``path`` resolved and created (with its parents); OutputDirError names what is wrong."""
    if not str(path).strip():
        raise OutputDirError(f"{option} {str(path)!r} is empty; allowed: a directory path")
    try:
        path = Path(path).expanduser().resolve()
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise OutputDirError(
            f"{option} {path}: a file is in the way (it or a parent is not a directory); allowed: a directory path"
        ) from None
    except OSError as error:
        raise OutputDirError(
            f"{option} {path}: cannot create the directory ({error.strerror or error}); "
            f"allowed: a writable directory path"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise OutputDirError(f"{option} {path}: the directory is not writable; allowed: a writable directory path")
    return path


def unique_output_dir(parent: Path, stem: str) -> Path:
    """``parent/<stem>-<date>-<time>``, created now; ``-2``, ``-3``, … when another launch
    took that name in the same second (``mkdir`` is atomic: two launches never share one)."""
    parent = create_output_dir(parent, "output folder")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in itertools.count(1):
        candidate = parent / (f"{stem}-{stamp}" if attempt == 1 else f"{stem}-{stamp}-{attempt}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        except OSError as error:
            raise OutputDirError(f"output folder {candidate}: cannot create it ({error.strerror or error})") from None
        return candidate


class OutputLock:
    """Hold a directory's lock for a ``with`` block (it must exist: see create_output_dir)."""

    def __init__(self, directory: Path):
        self.directory = Path(directory).resolve()

    def __enter__(self) -> OutputLock:
        with _held_guard:
            if self.directory in _held:
                _held[self.directory][1] += 1
                return self
            path = self.directory / LOCK_FILE
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as error:
                raise OutputDirError(f"output directory {self.directory}: cannot create {LOCK_FILE} "
                                     f"({error.strerror or error}); allowed: a writable directory") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                raise OutputLocked(
                    f"output directory {self.directory} is in use by another Basin launcher (PID {holder}); "
                    f"wait for it to end (or stop it), or choose another --out"
                ) from None
            previous = _read_pid(fd)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            _held[self.directory] = [fd, 1]
        mark_abandoned_summaries(self.directory, previous)
        return self

    def __exit__(self, *exc_info: object) -> None:
        with _held_guard:
            entry = _held[self.directory]
            entry[1] -= 1
            if entry[1] == 0:
                del _held[self.directory]
                os.close(entry[0])  # releases the lock; the file stays for the next holder


def _read_pid(fd: int) -> str:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return text if text.isdigit() else "unknown"


def mark_abandoned_summaries(directory: Path, holder: str) -> None:
    """Summaries under ``directory`` (its own and its runs') still saying ``running`` once
    their launcher is gone are marked ``killed``: no one writes them any more."""
    for path in (directory / "summary.json", *directory.glob("*/summary.json"), *directory.glob("runs/*/summary.json")):
        try:
            summary = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if summary.get("status") == "running":
            who = f"its launcher (PID {holder})" if holder != "unknown" else "its launcher"
            summary.update(status="killed", error=f"{who} stopped while the run was running (found at a later start)")
            write_json_atomic(path, summary)
