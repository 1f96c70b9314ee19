"""Progress bars that a log file can hold.

On a terminal every command draws tqdm's bars; in a Jupyter notebook (the Python API in a
kernel) tqdm's widget where ipywidgets is installed, else the same bars. When stderr is not a terminal (``nohup``,
a cluster job, CI, ``2> run.log``) a redrawn bar would write a partial line for every
redraw (a 2-minute run gave ~600 of them); :func:`progress_bar` then writes whole lines
instead, with the same figures the bar shows: one when it starts, one per change of what
it waits for (a run's start-up stage), at most one every :data:`LINE_INTERVAL_S` seconds
while it advances (so one per round when rounds are slower than that), and one at the
end.
"""

from __future__ import annotations

import sys
from typing import Any

# The shortest interval between two lines of an advancing bar written to a file.
LINE_INTERVAL_S = 30.0


# A log line: the bar's figures without the bar itself.
LINE_FORMAT = "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


class _WholeLines:
    """A stream that passes on only writes with text in them (tqdm's closing newline and
    carriage returns are dropped)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        if text.strip():
            self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def _line_bar_class():
    from tqdm import tqdm

    class LineProgress(tqdm):
        """tqdm writing one whole line per display, never a carriage return."""

        def display(self, msg: str | None = None, pos: int | None = None) -> bool:
            text = self.__str__() if msg is None else msg
            if text.strip():
                self.fp.write(text.strip() + "\n")
                self.fp.flush()
            return True

    return LineProgress


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel writing to its notebook (ipykernel's streams)."""
    return "ipykernel" in sys.modules and type(sys.stderr).__name__ == "OutStream"


def progress_bar(iterable: Any = None, **kwargs: Any):
    """A tqdm bar on a terminal, a widget in a notebook; whole lines (see the module docstring) otherwise."""
    from tqdm import tqdm

    stream = kwargs.get("file") or sys.stderr
    if kwargs.get("disable") or (hasattr(stream, "isatty") and stream.isatty()):
        return tqdm(iterable, **kwargs)
    if in_notebook() and "file" not in kwargs:
        # A widget where ipywidgets is installed; else the terminal's bar (a notebook's
        # output keeps one line per bar: it honours carriage returns).
        import importlib.util

        if importlib.util.find_spec("ipywidgets") is not None:
            from tqdm.notebook import tqdm as notebook_tqdm

            return notebook_tqdm(iterable, **kwargs)
        return tqdm(iterable, **kwargs)
    kwargs.update(mininterval=LINE_INTERVAL_S, miniters=1, dynamic_ncols=False, bar_format=LINE_FORMAT,
                  file=_WholeLines(stream))
    return _line_bar_class()(iterable, **kwargs)
