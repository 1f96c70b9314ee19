"""Output directories: created before Flower starts, one launcher at a time, unique names.

A launcher holds ``<directory>/.basin.lock`` locked (``fcntl.flock``) for as long as it
writes there; the file's first line is the holder's PID, the second the ``FLWR_HOME`` of
the run it has under way (:func:`record_holder`). A second launcher on the same
directory is refused at once, naming that PID. The kernel drops a lock when its holder
dies, however it dies, so the lock a dead launcher left behind is taken over: the new
holder first stops every process of the dead holder's run (found by that FLWR_HOME, so
only that run's: experiments/runtime/processes.py), which its guardian may not have reached yet,
and only then writes; the summaries the dead holder left saying ``running`` are marked
``killed``, but not those in a folder whose own lock a live launcher holds. A holder that
ends removes the file while still holding it; a launcher that locked the file just as it
was removed sees that the name no longer is its file and opens the folder's anew (so two
launchers never both hold one folder). Locks belong to a
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


class FolderHoldsAnotherRun(OutputDirError):
    """The output directory holds the results of a run with another config."""


def clear_folder(directory: Path) -> None:
    """Remove everything in ``directory`` but its lock (``--overwrite``)."""
    import shutil

    for entry in Path(directory).iterdir():
        if entry.name == LOCK_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


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
            fd = _lock_the_file(self.directory)
            previous = _read_pid(fd)
            stop_home_of_dead_holder(fd)
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
                # Removed while still held: a launcher that opened this file before it was
                # removed and locks it after the close finds the name no longer is its file
                # (_lock_the_file), and tries again.
                (self.directory / LOCK_FILE).unlink(missing_ok=True)
                os.close(entry[0])  # releases the lock


def _lock_the_file(directory: Path) -> int:
    """A descriptor of ``directory``'s lock file, locked by this process, that the name
    ``LOCK_FILE`` still names once locked (OutputLocked where another launcher holds it).
    The holder that ends removes the file while holding it; a launcher that had opened it
    just before gets the lock of a removed file and must not take that for the folder's."""
    path = directory / LOCK_FILE
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise OutputDirError(f"output directory {directory}: cannot create {LOCK_FILE} "
                                 f"({error.strerror or error}); allowed: a writable directory") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise OutputLocked(
                f"output directory {directory} is in use by another Basin launcher (PID {holder}); "
                f"wait for it to end (or stop it), or choose another --out"
            ) from None
        if _names(path, fd):
            return fd
        os.close(fd)  # the file was removed (or replaced) before we locked it: take the folder's own


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` is the file open as ``fd``."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (found.st_dev, found.st_ino) == (opened.st_dev, opened.st_ino)


def held_by_a_live_process(directory: Path) -> bool:
    """Whether a process, this one included, holds ``directory``'s lock now."""
    directory = Path(directory).resolve()
    with _held_guard:
        if directory in _held:
            return True
    try:
        fd = os.open(directory / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops the shared lock, if taken
    return False


def record_holder(directory: Path, flwr_home: str) -> None:
    """Write the FLWR_HOME of the run now under way into ``directory``'s lock, which this
    process holds (see the module docstring)."""
    with _held_guard:
        fd = _held[Path(directory).resolve()][0]
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n{flwr_home}\n".encode(), 0)


def _lock_lines(fd: int) -> list[str]:
    return os.pread(fd, 4096, 0).decode(errors="replace").splitlines()


def _read_pid(fd: int) -> str:
    lines = _lock_lines(fd)
    text = lines[0].strip() if lines else ""
    return text if text.isdigit() else "unknown"


def stop_home_of_dead_holder(fd: int) -> None:
    """Stop what the lock's previous (dead) holder had running, by the FLWR_HOME it recorded."""
    lines = _lock_lines(fd)
    if len(lines) > 1 and lines[1].strip():
        from experiments.runtime.processes import stop_home

        stop_home(lines[1].strip())


def mark_abandoned_summaries(directory: Path, holder: str, found: str = "found at a later start") -> None:
    """Summaries under ``directory`` (its own and its runs') still saying ``running`` once
    their launcher is gone are marked ``killed``: no one writes them any more. A folder
    whose lock a live process holds is left alone, ``directory`` itself unless this process
    holds it: another launcher writes there (a run's folder launched on its own, or a
    launcher that took the folder over before a dead holder's guardian got here)."""
    directory = Path(directory).resolve()
    with _held_guard:
        ours = directory in _held
    for path in (directory / "summary.json", *directory.glob("*/summary.json"), *directory.glob("runs/*/summary.json")):
        folder = path.parent
        if (folder != directory or not ours) and held_by_a_live_process(folder):
            continue
        try:
            summary = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if summary.get("status") == "running":
            who = f"its launcher (PID {holder})" if holder != "unknown" else "its launcher"
            summary.update(status="killed", error=f"{who} stopped while the run was running ({found})")
            write_json_atomic(path, summary)
