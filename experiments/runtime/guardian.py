"""``python -m experiments.runtime.guardian LAUNCHER_PID LAUNCHER_START HOME OUT_DIR``: wait while
the launcher runs; once it is gone, stop every process of the run (those whose
FLWR_HOME is under HOME), mark the run's summaries in OUT_DIR ``killed``, remove
HOME and the run's Ray session folder. SIGTERM (the launcher ending normally) ends it without stopping anything. See
experiments/runtime/processes.py."""

from __future__ import annotations

import shutil
import signal
import sys
import time
from pathlib import Path

from experiments.runtime.output_dir import mark_abandoned_summaries
from experiments.runtime.processes import GUARD_POLL_S, remove_finished_ray_sessions, same_process_alive, sessions_before, stop_home


def main(argv: list[str]) -> int:
    launcher, started, home, out_dir = int(argv[0]), float(argv[1]), Path(argv[2]), Path(argv[3])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    earlier_sessions = sessions_before(home)  # read now: the home is removed below
    while same_process_alive(launcher, started):
        time.sleep(GUARD_POLL_S)
    # The launcher is gone: nothing of its run may go on (nor write into its folder).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop_home(home)
    mark_abandoned_summaries(out_dir, str(launcher), "its processes stopped by the run's guardian")
    shutil.rmtree(home, ignore_errors=True)
    remove_finished_ray_sessions(earlier_sessions)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
