"""Following a `flwr run`: its rounds in results.csv, its summary, the start-up stages and
failure reason its flwr.log shows, and the progress bar that says what it waits for."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_summary(out_dir: Path) -> dict[str, Any] | None:
    """The run's summary.json (None before the ServerApp wrote one, or while it is half written)."""
    try:
        return json.loads((out_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def count_rounds(out_dir: Path) -> int:
    """Rounds a run has written to its results.csv (0 before the first)."""
    try:
        with open(out_dir / "results.csv") as f:
            return max(sum(1 for _ in f) - 1, 0)
    except OSError:
        return 0


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def flower_failure_reason(log_text: str) -> str | None:
    """The reason Flower's log gives for a failed run: its last ERROR line (a Python
    exception's last line when that is all there is), None when the log names none."""
    lines = [ANSI_ESCAPE.sub("", line).strip() for line in log_text.splitlines()]
    errors = [line for line in lines if line.startswith("ERROR")]
    if errors:
        return errors[-1].partition(":")[2].strip() or errors[-1]
    exceptions = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception|Interrupt)\b.*", line)]
    return exceptions[-1] if exceptions else None


# What a run waits for before its first round, recognised by the first line of each stage
# in flwr.log (Flower's own lines, then the ServerApp's); the last one seen is shown.
STARTUP_STAGES = (
    ("Starting local SuperLink", "starting the SuperLink"),
    ("Successfully started run", "starting the simulation"),
    ("Starting Flower Simulation", "starting Ray and the client processes"),
    ("[basin] loading", "loading data and building the partition"),
    ("[basin] discovering clients", "discovering clients"),
    ("[basin] resuming", "resuming from the checkpoint"),
    ("[basin] training round 1", "training round 1"),
)


# From this stage on the ServerApp runs inside the simulation process.
SERVER_APP_STARTED = "loading data and building the partition"


def startup_stages(log_text: str) -> list[str]:
    """The start-up stages a flwr.log shows, in STARTUP_STAGES order."""
    return [name for marker, name in STARTUP_STAGES if marker in log_text]


def startup_stage(log_text: str) -> str:
    """The start-up stage a flwr.log has reached ("starting Flower" before any line)."""
    return (["starting Flower", *startup_stages(log_text)])[-1]


FAILED_RUN_LOG_GRACE_S = 3.0
# The ServerApp's last line of a completed run (strategies/server_work.py). Flower streams
# the ServerApp's lines into flwr.log a moment after they are written, and the launcher
# stops a completed run's processes at once: it waits for this line first (0.1-0.5 s on 2
# cores; Flower's own end comes ~3 s later), or the log lost its last rounds, and a quick
# run the start-up stages after its data (a job's later runs take ~2 s). At most 15 s: on a
# heavily loaded machine a run with Flower's own commands got none of its lines in 3 s (a
# fresh clone's CI, 2026-11-30); the main job with them took 45 s either way unloaded.
COMPLETED_LINE = "[basin] completed:"
COMPLETED_RUN_LOG_GRACE_S = 15.0


def _note_stages(log_path: Path, seen: dict[str, float]) -> str:
    """Read flwr.log; note in ``seen`` when each start-up stage it shows was first seen (now,
    for those new); return its text ('' while it cannot be read)."""
    try:
        log_text = log_path.read_text(errors="replace")
    except OSError:
        log_text = ""
    now = time.time()
    for stage in startup_stages(log_text):
        seen.setdefault(stage, now)
    return log_text


def follow_run(
    process: subprocess.Popen, out_dir: Path, num_rounds: int, progress: bool, label: str, leave: bool,
    server_alive: Callable[[], bool] | None = None, stop: threading.Event | None = None,
    check: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Wait for ``flwr run``, drawing a progress bar of rounds written to results.csv; until
    the first round is written the bar says which start-up stage the run is in. Returns
    when each start-up stage was first seen in flwr.log (``time.time()``, polled every
    0.2 s).

    Returns as soon as the ServerApp has marked the run completed (it writes the summary
    last, after the final model), or a few seconds after it marked it failed (time for
    Flower to log the error's traceback): the tens of seconds Flower then spends shutting
    down Ray and the log stream would only delay the next run; the caller stops those
    processes. With ``server_alive``, also returns once the ServerApp has started (its line
    in the log, or its summary.json) and its process is gone twice in a row (checked every
    second) without a recorded end: killed from outside, where ``flwr run`` itself would
    wait about a minute. ``check`` is called at each poll: what it raises (e.g. a job's Ray
    cluster that cannot start) ends the wait.
    """
    from experiments.runtime.progress import progress_bar

    log_path = out_dir / "flwr.log"
    last_stage = STARTUP_STAGES[-1][1]
    seen: dict[str, float] = {}
    server_checked, server_missing = 0.0, 0
    shown_stage = ""
    with progress_bar(total=num_rounds, desc=label or out_dir.name, unit="round", disable=not progress, leave=leave) as bar:
        while process.poll() is None:
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt
            if check is not None:
                check()
            bar.update(count_rounds(out_dir) - bar.n)
            if last_stage not in seen:
                log_text = _note_stages(log_path, seen)
                if progress and bar.n == 0 and startup_stage(log_text) != shown_stage:
                    shown_stage = startup_stage(log_text)  # a line of its own when written to a file
                    bar.set_postfix_str(shown_stage, refresh=True)
            if progress and bar.n > 0 and bar.postfix:
                bar.set_postfix_str("", refresh=False)
            summary = read_summary(out_dir)
            if summary is not None and summary.get("status") == "completed":
                deadline = time.monotonic() + COMPLETED_RUN_LOG_GRACE_S
                while COMPLETED_LINE not in _note_stages(log_path, seen) and process.poll() is None \
                        and time.monotonic() < deadline:
                    time.sleep(0.02)
                break
            if summary is not None and summary.get("status") == "failed":
                try:
                    process.wait(timeout=FAILED_RUN_LOG_GRACE_S)
                except subprocess.TimeoutExpired:
                    pass
                break
            # Started: its start-up line in Flower's log, or the summary it writes as it starts (the
            # launcher removed the last one): the streamed log lagged tens of seconds behind under load.
            started = SERVER_APP_STARTED in seen or summary is not None
            if server_alive is not None and started and time.monotonic() - server_checked >= 1.0:
                server_checked = time.monotonic()
                server_missing = 0 if server_alive() else server_missing + 1
                if server_missing == 2:
                    break
            time.sleep(0.2)
        bar.update(count_rounds(out_dir) - bar.n)
    return seen
