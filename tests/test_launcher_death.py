"""A launcher that dies, however it dies, leaves nothing of its run behind, and the same
command then resumes to exactly the uninterrupted run (real `experiments.run` processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import processes_in_scope

from experiments.runtime.output_dir import LOCK_FILE
from experiments.runtime.processes import process_table, processes_of_home, ray_sessions, session_owner
from experiments.runtime.run_config import APP_DIR

pytestmark = pytest.mark.slow  # real launchers killed: the second tier (.ci/run)

# 4 clients, 1 a round (one client process per run alone, ~2.6 CPU-s to start), 40 rounds of ~0.1 s
# (4 epochs of batches of 4), a checkpoint every 2: killed after round 3 or so, the resumed run redoes the
# rounds after its last checkpoint. Enough rounds that the run cannot finish while its launcher's death is
# cleaned up (16 did, once rounds got faster: the summary then said completed).
SETTINGS = {"num-clients": 4, "participation": 0.25, "num-rounds": 40, "local-epochs": 4, "batch-size": 4, "device": "cpu",
            "averaging": "ima", "window": 2, "avg-start": 4, "checkpoint-every": 2}
TIMING_COLUMNS = ["round-seconds", "train-seconds", "eval-seconds", "client-seconds"]
WAYS = ("sigkill", "sighup-group", "ctrl-c-twice", "guardian-then-sigkill")
# The ways whose folder the same command then resumes: a launcher killed (its lock left to a
# dead process) and one interrupted (its summary says so). A guardian killed first leaves the
# folder as "sigkill" does, and a SIGHUP to the group as "sigkill" or, when the clients saw
# it first, as client processes killed mid-run (tests/test_client_process_death.py resumes that
# one): one proof each.
RESUMED_AFTER = ("sigkill", "ctrl-c-twice")


def _command(out: Path, settings: dict = SETTINGS) -> list[str]:
    sets = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    return [sys.executable, "-m", "experiments.run", *sets, "--out", str(out)]


# Run before the launcher's own Python starts (it replaces this process): Ctrl-C and SIGHUP do
# what they do for a command typed in a terminal. A suite started in the background (``&``,
# ``nohup``) passes SIGINT and SIGHUP on ignored, and the launcher would then not die of them
# (its run completed: that was "clean-up takes 5–8 s late in a full suite run"). Not
# Popen's preexec_fn: the launchers start from threads (``deaths``), where it is unsafe.
AS_FROM_A_TERMINAL = ("import os, signal, sys\n"
                      "for signum in (signal.SIGINT, signal.SIGHUP):\n"
                      "    signal.signal(signum, signal.SIG_DFL)\n"
                      "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n")


def _guardian_of(home: str) -> int | None:
    """The PID of the guardian of the run whose FLWR_HOME is ``home`` (None while there is none)."""
    return next((pid for pid, (_, _, command) in process_table().items()
                 if "experiments.runtime.guardian" in command and f" {home} " in command), None)


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []


def _rows(path: Path) -> int:
    return max(len(_lines(path)) - 1, 0)


# The uninterrupted run that a resumed one must equal: launched with the session's other
# reference runs (tests/conftest.py's flower_runs).
FLOWER_RUNS = {"launcher-death-uninterrupted": SETTINGS}
UNINTERRUPTED = pytest.mark.flower_runs("launcher-death-uninterrupted")


def _uninterrupted(flower_runs) -> tuple[pd.DataFrame, dict[str, torch.Tensor]]:
    run = flower_runs["launcher-death-uninterrupted"]
    return run.rows(), torch.load(run.completed() / "final_model.pt", weights_only=True)


@dataclass
class Death:
    """One way's launcher killed after round 3 (``_die``): what it left, then its resume."""

    out: Path
    home: str
    stopped_within: float  # seconds from the death until no process of the run was left
    left: list[int]  # the run's processes still there 10 s after the death
    sessions_left: list[Path]  # Ray session folders that the run's processes started, still there
    stderr: str
    summary: dict  # summary.json once the run's processes had gone (a resume rewrites it)
    rows_after_death: int
    rows_a_second_later: int
    resumed: subprocess.CompletedProcess | None


def _die(way: str, folder: Path) -> Death:
    """Launch the run in ``folder``, kill its launcher ``way`` after round 3, wait for its
    processes to go; then, for the ways in RESUMED_AFTER, run the same command again."""
    out = folder / "run"
    sessions = ray_sessions()
    launcher = subprocess.Popen([sys.executable, "-c", AS_FROM_A_TERMINAL, *_command(out)[1:]], cwd=APP_DIR,
                                start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env={**os.environ, "PYTHONPATH": str(APP_DIR)})
    try:
        deadline = time.monotonic() + 180
        while _rows(out / "results.csv") < 3:
            assert time.monotonic() < deadline and launcher.poll() is None, f"{way}: the run never reached round 3"
            time.sleep(0.05)
        home = (out / LOCK_FILE).read_text().splitlines()[1]  # the run's FLWR_HOME, as the lock records it
        run = processes_of_home(home)
        assert run, f"{way}: the run's processes are found by their FLWR_HOME"
        if way == "guardian-then-sigkill":  # the OOM killer or a user's kill takes the guardian first
            guardian = _guardian_of(home)
            os.kill(guardian, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while _guardian_of(home) in (None, guardian):
                assert time.monotonic() < deadline, "no new guardian 5 s after the first one died"
                time.sleep(0.05)
        if way in ("sigkill", "guardian-then-sigkill"):
            os.kill(launcher.pid, signal.SIGKILL)
        elif way == "sighup-group":  # the terminal or SSH session closed
            os.killpg(launcher.pid, signal.SIGHUP)
        else:
            os.kill(launcher.pid, signal.SIGINT)
            time.sleep(0.3)
            os.kill(launcher.pid, signal.SIGINT)
        died = time.monotonic()
        launcher.wait(timeout=60)
        while processes_of_home(home) and time.monotonic() - died < 10:
            time.sleep(0.1)
        stopped_within = time.monotonic() - died
        while Path(home).exists() and time.monotonic() - died < 10:  # the guardian's last step: its clean-up is done
            time.sleep(0.05)
        left = processes_of_home(home)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    # Other ways' runs go on beside this one: its own Ray session is the one a process of the run
    # started. Waited for as the home is (its folder went after the home in a CI run of 2026-11-29).
    def own_sessions() -> list[Path]:
        return sorted(session for session in ray_sessions() - sessions if session_owner(session) in run)

    while own_sessions() and time.monotonic() - died < 10:
        time.sleep(0.05)
    sessions_left = own_sessions()
    rows_after_death = _rows(out / "results.csv")
    time.sleep(1.0)
    death = Death(out, home, stopped_within, left, sessions_left, launcher.stderr.read().decode(),
                  json.loads((out / "summary.json").read_text()), rows_after_death, _rows(out / "results.csv"), None)
    if way in RESUMED_AFTER and not left:
        death.resumed = subprocess.run(_command(out), cwd=APP_DIR, capture_output=True, text=True, timeout=300,
                                       env={**os.environ, "PYTHONPATH": str(APP_DIR)})
    return death


# The ways die two at once, the two that resume first: one run alone leaves part of the 2
# cores idle (its start-up, its clean-up's waits). The four took 95 s instead of 107 s one
# after another (2 cores, 2026-11-29). Each way's processes, FLWR_HOME and Ray session are
# its own; ``deaths`` also checks that no session is left once all have ended.
WAYS_AT_ONCE = 2


@dataclass
class Deaths:
    """``deaths``: each way's outcome, and the Ray session folders left once all had ended."""

    of: dict[str, Future]
    sessions_left: list[Path]


@pytest.fixture(scope="module")
def deaths(request, tmp_path_factory) -> Deaths:
    """``_die`` for each way that this session's selected tests name, WAYS_AT_ONCE at a time."""
    selected = [item.callspec.params["way"] for item in request.session.items
                if item.originalname == "test_a_dying_launcher_leaves_nothing_and_the_same_command_resumes_exactly"]
    ordered = sorted(selected, key=lambda way: way not in RESUMED_AFTER)
    sessions = ray_sessions()
    with ThreadPoolExecutor(max_workers=WAYS_AT_ONCE) as pool:
        futures = {way: pool.submit(_die, way, tmp_path_factory.mktemp(way)) for way in ordered}
    # Every launcher has ended, the resumed ones too (each removes its run's session as it ends).
    return Deaths(futures, sorted(ray_sessions() - sessions))


@pytest.mark.parametrize("way", [pytest.param(way, marks=UNINTERRUPTED) if way in RESUMED_AFTER else way for way in WAYS])
def test_a_dying_launcher_leaves_nothing_and_the_same_command_resumes_exactly(deaths, flower_runs, way):
    death = deaths.of[way].result()
    out, home = death.out, death.home
    assert not death.left, f"left running {death.stopped_within:.1f} s after the launcher's death: {death.left}"
    # 1.1 s (SIGHUP) and 1.7 s (Ctrl-C twice) on 2 cores, also with the cores kept busy.
    # The bound is for "stopped promptly", not a benchmark.
    assert death.stopped_within < 8
    summary = death.summary
    if way == "sighup-group" and summary["status"] == "failed":
        # SIGHUP reaches the whole group, Ray's client processes too: the ServerApp may see
        # them die and record that (ClientProcessesDied) before the guardian stops it.
        assert "clients failed because their processes died" in summary["error"], summary
    else:
        assert summary["status"] == ("interrupted" if way == "ctrl-c-twice" else "killed"), summary
    if way == "guardian-then-sigkill":
        assert "the run's guardian" in death.stderr, "the launcher says it started a new guardian"
    assert death.rows_a_second_later == death.rows_after_death  # nothing writes into the folder any more
    assert not Path(home).exists()
    assert not death.sessions_left  # nor the killed run's Ray session folder
    if way not in RESUMED_AFTER:
        return

    resumed = death.resumed
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not deaths.sessions_left  # the resumed runs' Ray session folders (logs, sockets) are removed too
    rows, final = _uninterrupted(flower_runs)
    results = pd.read_csv(out / "results.csv")
    assert results["round"].tolist() == list(range(1, SETTINGS["num-rounds"] + 1))  # each round once
    pd.testing.assert_frame_equal(results.drop(columns=TIMING_COLUMNS), rows.drop(columns=TIMING_COLUMNS), check_exact=True)
    model = torch.load(out / "final_model.pt", weights_only=True)
    assert all(torch.equal(model[k], final[k]) for k in final)
    assert not (out / LOCK_FILE).exists()  # a launcher that ends removes its lock


def test_stopping_a_run_from_a_process_that_carries_its_flwr_home_does_not_stop_that_process(tmp_path):
    """The plain `flwr run` recipe's last step, run with FLWR_HOME still exported."""
    home = tmp_path / "home"
    home.mkdir()
    code = ("import subprocess, sys, time\n"
            "from experiments.runtime.processes import processes_of_home, stop_home\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "time.sleep(0.5)\n"
            f"stopped = stop_home({str(home)!r})\n"
            "print('survived', child.pid in stopped, child.wait(timeout=10) != 0, flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=APP_DIR, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "FLWR_HOME": str(home), "PYTHONPATH": str(APP_DIR)})
    assert done.stdout.strip() == "survived True True", done.stderr[-2000:]


# A batch script without job control (bash without -i, a SLURM job, a Makefile, a CI step)
# starts the launcher with `&`: the launcher, and the `flwr run` it starts, are then in
# the script's process group. So is a Python program's child started without a session
# of its own. Losing the launcher must not take the caller down with the run.
_BATCH_SCRIPT = """
"$@" >/dev/null 2>&1 &
launcher=$!
until [ "$(wc -l 2>/dev/null < "$OUT/results.csv" || echo 0)" -ge 2 ]; do
  kill -0 "$launcher" 2>/dev/null || exit 3
  sleep 0.1
done
kill -9 "$launcher"
# The guardian stops the run's processes, then marks it killed: wait for that (a ceiling of 120 s).
for _ in $(seq 1200); do
  grep -Eq '"status": *"killed"' "$OUT/summary.json" 2>/dev/null && break
  sleep 0.1
done
sleep 1
echo survived > "$MARKER"
"""
_PYTHON_CALLER = """
import os, signal, subprocess, sys, time
from pathlib import Path
out, marker = Path(os.environ["OUT"]), Path(os.environ["MARKER"])
launcher = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
while not (out / "results.csv").is_file() or len((out / "results.csv").read_text().splitlines()) < 2:
    if launcher.poll() is not None:
        sys.exit(3)
    time.sleep(0.1)
os.kill(launcher.pid, signal.SIGKILL)
deadline = time.monotonic() + 120  # the guardian stops the run's processes, then marks it killed
summary = out / "summary.json"
while '"killed"' not in (summary.read_text() if summary.is_file() else "") and time.monotonic() < deadline:
    time.sleep(0.1)
time.sleep(1)
marker.write_text("survived")
"""


def test_a_killed_launcher_does_not_take_down_the_script_or_program_that_started_it(tmp_path, scoped_env):
    """Both kinds of caller at once (each run is small). Each caller waits until the run's
    guardian has stopped the run's processes and marked it killed, then 1 s: a caller taken
    down with the run never writes its marker."""
    env, scope = scoped_env
    callers = {"bash-script": ["bash", "-c", _BATCH_SCRIPT, "batch"], "python-popen": [sys.executable, "-c", _PYTHON_CALLER]}
    started = {}
    for name, interpreter in callers.items():
        out = tmp_path / name / "run"
        caller_env = {**env, "PYTHONPATH": str(APP_DIR), "OUT": str(out), "MARKER": str(tmp_path / name / "marker")}
        # Each caller gets a session of its own, so that the test runner is safe whatever happens to it.
        started[name] = subprocess.Popen([*interpreter, *_command(out)], cwd=APP_DIR, env=caller_env,
                                         start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    errors = {}
    try:
        for name, caller in started.items():
            _, errors[name] = caller.communicate(timeout=240)
    finally:
        for caller in started.values():
            if caller.poll() is None:
                os.killpg(caller.pid, signal.SIGKILL)
                caller.wait()
    for name, caller in started.items():
        assert caller.returncode == 0, f"{name} ended with {caller.returncode} (-9: killed with the run): {errors[name][-2000:]}"
        assert (tmp_path / name / "marker").read_text().strip() == "survived"
        assert json.loads((tmp_path / name / "run" / "summary.json").read_text())["status"] == "killed"
    assert processes_in_scope(scope) == set(), "processes of the runs are left"
