"""How every Basin command ends on input the user can fix, and on Ctrl-C.

An error the user caused (a bad value, a missing file, a locked or unwritable output
directory, a checkpoint of another run, …) prints one line, ``error: …`` with what is
allowed or what to do, and exits 2; no traceback. Ctrl-C, or SIGTERM, ends with exit 130.
Errors of other kinds are bugs and keep their traceback.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import tomllib
from collections.abc import Callable
from pathlib import Path

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(ValueError):
    """Input the user can fix: a command-line value, a file's content."""


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


def user_errors() -> tuple[type[BaseException], ...]:
    """The exception types that mean bad input (imported here: not before the command needs them)."""
    from experiments.ray_cluster import RayClusterUnreachable
    from strategies.checkpoint import CheckpointError

    # ConfigError, DataUnavailable, OutputDirError, SweepError and UsageError are ValueErrors.
    return ValueError, FileNotFoundError, tomllib.TOMLDecodeError, CheckpointError, RayClusterUnreachable


def _interrupt(signum, frame) -> None:
    # SIGTERM unwinds like Ctrl-C, so the Flower processes a command started are stopped.
    raise KeyboardInterrupt


def guarded(body: Callable[[], int]) -> int:
    """``body()``'s exit code; 2 with one line for a user error, 130 when interrupted."""
    in_main_thread = threading.current_thread() is threading.main_thread()  # signals: main thread only
    previous = signal.signal(signal.SIGTERM, _interrupt) if in_main_thread else None
    try:
        return body()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except user_errors() as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
