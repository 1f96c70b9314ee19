"""How every Basin command ends on input the user can fix, and on Ctrl-C.

An error the user caused (a bad value, a missing file, a locked or unwritable output
directory, a checkpoint of another run, …) prints one line, ``error: …`` with what is
allowed or what to do, and exits 2; no traceback. A full disk prints one line, ``error:
the disk holding <folder> is full (…): free space and run the same command to resume``, and
exits 3. Ctrl-C, or SIGTERM, ends with exit 130. Errors of other kinds are bugs and keep
their traceback.
"""

from __future__ import annotations

import argparse
import errno
import gc
import os
import shutil
import signal
import sys
import threading
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

EXIT_USAGE = 2
EXIT_DISK_FULL = 3
EXIT_INTERRUPTED = 130
# What a full disk, or a full quota, makes a write fail with.
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
NO_SPACE = f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}"


class UsageError(ValueError):
    """Input the user can fix: a command-line value, a file's content."""


class DiskFull(Exception):
    """A write failed because the disk holding ``folder`` is full: free space, and the same
    command resumes (the run's checkpoint is whole)."""

    def __init__(self, folder: Path | str, cause: str, what_to_do: str = "free space") -> None:
        super().__init__(f"the disk holding {folder} is full ({cause}): {what_to_do} and run the same "
                         "command to resume")


def is_disk_full(error: BaseException | None) -> bool:
    """Whether ``error``, or an error it was raised from or while handling, is a full disk:
    ENOSPC or EDQUOT, also among the errors of a ``shutil`` tree copy."""
    return _full_disk_write(error) is not None


def disk_full_error(error: BaseException) -> DiskFull:
    """The DiskFull of an error that :func:`is_disk_full`: the folder of the file it could not write."""
    filename = _full_disk_write(error)
    return DiskFull(Path(os.path.dirname(os.path.abspath(filename))) if filename else Path.cwd(), NO_SPACE)


def _full_disk_write(error: BaseException | None) -> str | None:
    """The file that a full disk could not take in ``error``'s chain ("" if it names none), or None."""
    while error is not None:
        if isinstance(error, shutil.Error):  # copytree collects its errors as (source, destination, why)
            entries = error.args[0] if error.args and isinstance(error.args[0], list) else []
            for entry in entries:
                if any(f"[Errno {number}]" in str(entry) for number in DISK_FULL_ERRNOS):
                    return str(entry[1]) if isinstance(entry, tuple) and len(entry) == 3 else ""
        elif isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
            return str(error.filename or "")
        error = error.__cause__ or error.__context__
    return None


def nonempty_path(text: str) -> Path:
    """An argparse type for ``--out``: an empty value (an unset shell variable) would mean
    the current folder; it is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path is not allowed; allowed: a path")
    return Path(text)


def gpu_share(text: str) -> float | None:
    """An argparse type for ``--gpus-per-client``: a fraction, or ``auto`` (None)."""
    if text == "auto":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: a number in [0, 1] or 'auto'") from None


def parallel_runs(text: str) -> int | None:
    """An argparse type for ``--parallel``: an integer >= 1, or ``auto`` (None)."""
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: an integer >= 1 or 'auto'")
    return value


def add_verbosity_options(parser: argparse.ArgumentParser) -> None:
    """``--quiet`` and ``--verbose``: how much of Basin's log (``[basin] …`` lines) this
    command shows; its results and errors are shown either way."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", action="store_true",
                       help="show only Basin's warnings and errors, not its progress lines")
    group.add_argument("-v", "--verbose", action="store_true", help="show Basin's debug lines too")


def apply_verbosity(args: argparse.Namespace) -> None:
    """Set the level of the ``basin`` logger of this process from ``--quiet``/``--verbose``
    (the runs' own processes write their lines to the runs' logs whatever it is)."""
    import logging

    from clients.log import log

    log.setLevel(logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO)


def user_errors() -> tuple[type[BaseException], ...]:
    """The exception types that mean bad input (imported here: not before the command needs them)."""
    from experiments.runtime.ray_cluster import RayClusterUnreachable
    from strategies.checkpoint import CheckpointError

    # ConfigError, DataUnavailable, OutputDirError, SweepError and UsageError are ValueErrors.
    return ValueError, FileNotFoundError, tomllib.TOMLDecodeError, CheckpointError, RayClusterUnreachable


def _interrupt(signum, frame) -> None:
    # SIGTERM unwinds like Ctrl-C, so the Flower processes a command started are stopped.
    raise KeyboardInterrupt


def guarded(body: Callable[[], int]) -> int:
    """``body()``'s exit code; 2 with one line for a user error, 3 for a full disk, 130 when interrupted."""
    from clients.log import log

    in_main_thread = threading.current_thread() is threading.main_thread()  # signals: main thread only
    previous = signal.signal(signal.SIGTERM, _interrupt) if in_main_thread else None
    try:
        return body()
    except KeyboardInterrupt:
        log.warning("interrupted", extra={"bare": True})
        return EXIT_INTERRUPTED
    except DiskFull as error:
        log.error(f"error: {error}", extra={"bare": True})
        return EXIT_DISK_FULL
    except Exception as error:
        if is_disk_full(error):  # before the user errors: an OSError may be both
            log.error(f"error: {disk_full_error(error)}", extra={"bare": True})
            return EXIT_DISK_FULL
        if not isinstance(error, user_errors()):
            raise
        log.error(f"error: {error}", extra={"bare": True})
        return EXIT_USAGE
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def exit_command(code: int) -> NoReturn:
    """End a command-line tool with ``code``, without the second its interpreter would spend
    collecting every object of torch, pandas and the like at exit (measured: 1.07 s → 0.24 s
    after importing torch, pandas and matplotlib on 2 CPU cores). Its objects are frozen,
    not freed one by one: exit handlers and output flushing run as usual."""
    gc.freeze()
    sys.exit(code)
