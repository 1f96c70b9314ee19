"""Basin's log: the standard ``logging`` logger ``basin`` (a tool's own lines: ``basin.<tool>``),
in every process a run has: the launcher, Flower's ServerApp process and the client processes.

Each record is one whole line, ``[basin] <message>`` (``[<tool>]`` for ``basin.<tool>``),
on the process's current standard error: Flower mirrors a run's processes' output into the
run's log by replacing their streams, so the stream is looked up as each line is written.
The level is INFO unless one was set on the logger (a notebook's
``logging.getLogger("basin").setLevel(logging.WARNING)``, the command lines' ``--quiet``
and ``--verbose``): in the launcher's process only. The ServerApp's lines always reach the
run's log, flwr.log, which the launcher reads for its progress (not the terminal).
"""

from __future__ import annotations

import logging
import sys

LOGGER_NAME = "basin"


class CurrentStderrHandler(logging.Handler):
    """Writes each record as a whole line to whatever ``sys.stderr`` is at that moment."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # a closed stream at interpreter exit: logging's own policy
            self.handleError(record)


class PrefixFormatter(logging.Formatter):
    """``[basin] message``; ``[tool] message`` for the logger ``basin.tool``; the message
    alone for a record logged with ``extra={"bare": True}`` (a command's own closing line)."""

    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, "bare", False):
            return record.getMessage()
        return f"[{record.name.rpartition('.')[2]}] {record.getMessage()}"


def basin_logger() -> logging.Logger:
    """The ``basin`` logger with its handler (added once per process) and its level."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(handler, CurrentStderrHandler) for handler in logger.handlers):
        handler = CurrentStderrHandler()
        handler.setFormatter(PrefixFormatter())
        logger.addHandler(handler)
        logger.propagate = False  # a root handler (Flower's, a notebook's basicConfig) would print it twice
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    return logger


log = basin_logger()
