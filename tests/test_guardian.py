"""The run's guardian (experiments/runtime/guardian.py) stops a run exactly when its
launcher is gone: never while the launcher runs, whatever the clock does, and within
moments of a SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from experiments.runtime.processes import REPO, Guardian, alive

# In the guardian's process (it inherits PYTHONPATH): every process's start time reads
# differently each time it is asked, as after the wall clock was stepped (NTP, a resumed VM).
MOVING_CLOCK = """
import itertools, psutil
_steps = itertools.count()
psutil.Process.create_time = lambda self: 1.0e9 + next(_steps)
"""


def _process_of_run(home: Path) -> subprocess.Popen:
    """A stand-in for one of the run's processes: it has the run's FLWR_HOME."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                            env={**os.environ, "FLWR_HOME": str(home)})


def _wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.fixture
def run_folders(tmp_path):
    home, out = tmp_path / "home", tmp_path / "out"
    home.mkdir()
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"status": "running"}))
    return home, out


def test_a_launcher_whose_start_time_reads_differently_each_time_is_not_declared_dead(run_folders, tmp_path,
                                                                                         monkeypatch):
    home, out = run_folders
    (tmp_path / "clock").mkdir()
    (tmp_path / "clock" / "sitecustomize.py").write_text(MOVING_CLOCK)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "clock"))
    run_process = _process_of_run(home)
    guardian = Guardian(home, out)
    try:
        # The guardian's own start and its first looks at the launcher take well under this.
        assert not _wait_until(lambda: guardian.process.poll() is not None or not alive(run_process.pid), 3.0), \
            "the guardian stopped a run whose launcher runs"
        assert json.loads((out / "summary.json").read_text())["status"] == "running" and home.is_dir()
    finally:
        guardian.stop()
        run_process.kill()
        run_process.wait()
    assert guardian.restarts == 0


def test_a_sigkilled_launcher_is_noticed_within_seconds(run_folders):
    home, out = run_folders
    run_process = _process_of_run(home)
    launcher = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from pathlib import Path
            from experiments.runtime.processes import Guardian
            guardian = Guardian(Path({str(home)!r}), Path({str(out)!r}))
            print(guardian.process.pid, flush=True)
            time.sleep(120)
        """)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    guardian_pid = int(launcher.stdout.readline())
    try:
        time.sleep(0.5)  # the guardian is waiting on its lifeline
        assert alive(run_process.pid) and alive(guardian_pid)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        killed_at = time.monotonic()
        # Noticed at once (end of file; nothing polls); the bound only guards against a hang, with
        # room for a loaded machine's process scan.
        assert _wait_until(lambda: not alive(run_process.pid), 30.0), "the run's process outlived its launcher"
        assert time.monotonic() - killed_at < 30.0
        assert _wait_until(lambda: not alive(guardian_pid), 30.0)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "killed" and f"PID {launcher.pid}" in summary["error"]
        assert not home.exists()
    finally:
        for pid in (run_process.pid, guardian_pid):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        run_process.wait()


def test_a_finished_rays_session_folder_is_removed_with_the_latest_link_that_names_it(tmp_path, monkeypatch):
    """Ray links ``session_latest`` to the newest session; removing that session's folder
    removes the link too (it was left dangling in /tmp/ray after every run), and a link to
    a session that is kept stays."""
    from experiments.runtime.processes import ray_sessions, remove_finished_ray_sessions

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    root = tmp_path / "ray"
    finished, running = root / f"session_2026-11-29_15-13-22_1_{ended.pid}", root / f"session_2026-11-29_15-13-23_1_{os.getpid()}"
    for session in (finished, running):
        (session / "logs").mkdir(parents=True)
    latest = root / "session_latest"
    latest.symlink_to(finished)
    remove_finished_ray_sessions(set())
    assert ray_sessions() == {running} and not latest.is_symlink()
    latest.symlink_to(running)
    remove_finished_ray_sessions(set())
    assert latest.resolve() == running
