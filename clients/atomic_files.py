"""Files written whole or not at all: what every writer of a run's folder uses (summaries,
checkpoints, saved models, sweep tables), so that a full disk leaves the old file and no
temporary one. No torch here: the command lines import it before they need torch."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to a temporary file beside ``path``, flushed to disk, then rename it
    over ``path``: a reader sees the old file or the new one, never a torn one (also after
    ``kill -9``). When the write fails (a full disk: ``OSError`` ENOSPC, naming ``path``)
    the temporary file is removed before the error is raised, and ``path`` is unchanged."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        if error.filename is None:  # a failed write or flush names no file
            error.filename = str(path)
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
