"""``.venv/bin/python -m experiments.runtime.guardian LAUNCHER_PID LIFELINE_FD HOME OUT_DIR``: wait while
the launcher runs, i.e. until the lifeline (a pipe whose write end only the launcher holds)
reads end of file; then stop every process of the run (those whose FLWR_HOME is under
HOME), mark the run's summaries in OUT_DIR ``killed``, remove HOME and the run's Ray
session folder. SIGTERM (the launcher ending normally) ends it without stopping anything.
See experiments/runtime/processes.py."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

from experiments.runtime.output_dir import mark_abandoned_summaries
from experiments.runtime.processes import remove_finished_ray_sessions, sessions_before, stop_home


def wait_for_end_of_file(fd: int) -> None:
    """Return once every write end of the pipe ``fd`` reads from is closed."""
    while os.read(fd, 4096):
        continue


def main(argv: list[str]) -> int:
    launcher, lifeline, home, out_dir = argv[0], int(argv[1]), Path(argv[2]), Path(argv[3])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    earlier_sessions = sessions_before(home)  # read now: the home is removed below
    wait_for_end_of_file(lifeline)
    # The launcher is gone: nothing of its run may go on (nor write into its folder).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop_home(home)
    mark_abandoned_summaries(out_dir, launcher, "its processes stopped by the run's guardian")
    shutil.rmtree(home, ignore_errors=True)
    remove_finished_ray_sessions(earlier_sessions)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
