"""A run's ClientApp processes that die or hang, not its launcher: killed mid-run, they stop
the run without a skipped round and the same command resumes it exactly; one frozen (SIGSTOP)
fails its round after `round-timeout` and the run completes (real `experiments.run` processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import SCOPE_VARIABLE, processes_in_scope
from test_launcher_death import SETTINGS, TIMING_COLUMNS, UNINTERRUPTED, _command, _lines, _rows, _uninterrupted

from experiments.runtime.output_dir import LOCK_FILE
from experiments.runtime.processes import process_table, processes_of_home
from experiments.runtime.run_config import APP_DIR

pytestmark = pytest.mark.slow  # real runs' client processes killed: the second tier (.ci/run)

# The uninterrupted run that the resumed one must equal: the one the launcher deaths compare with.
FLOWER_RUNS = {"launcher-death-uninterrupted": SETTINGS}

# The frozen client's run: 2 clients a round (two client processes), 24 rounds of ~0.1 s (8 once
# ended before its client processes were seen, 2026-12-05).
FROZEN = {**SETTINGS, "participation": 0.5, "num-rounds": 24, "round-timeout": 4}


def _home_of(out: Path, launcher: subprocess.Popen) -> str:
    """The FLWR_HOME of the run in ``out``, once its lock records it."""
    deadline = time.monotonic() + 180
    while len(lock := _lines(out / LOCK_FILE)) < 2:
        assert time.monotonic() < deadline and launcher.poll() is None, "the run never recorded its FLWR_HOME"
        time.sleep(0.05)
    return lock[1]


def _client_processes_after(out: Path, launcher: subprocess.Popen, rounds: int) -> list[int]:
    """The ClientApp processes of the run in ``out`` as soon as its round ``rounds`` is written:
    those it has then that were seen as one (``ray::ClientAppActor``) since its start.

    Looked for from the start, not only after the round: read once just after round 3, none
    was found (CI, 2026-11-28); looked for from then until found, the run's last 37 rounds
    (~3.6 s) had ended first (CI, 2026-12-05). And all of them: the first one seen is not
    always one that trains (its partner, then ``ray::IDLE``, took the rounds)."""
    home = _home_of(out, launcher)
    seen: set[int] = set()
    deadline = time.monotonic() + 180
    while True:
        written = _rows(out / "results.csv") >= rounds  # before the look: what it sees is there after the round
        table = process_table()
        run = processes_of_home(home)
        seen.update(pid for pid in run if table.get(pid, (0, 0, ""))[2].startswith("ray::ClientAppActor"))
        if written and (clients := sorted(seen & set(run))):
            return clients
        assert time.monotonic() < deadline and launcher.poll() is None, (
            f"the run's client processes are not found by round {rounds}; its processes: "
            + "; ".join(f"{pid} {table.get(pid, (0, 0, '?'))[2][:80]}" for pid in run))
        time.sleep(0.05)


@dataclass
class Ended:
    """A run whose client processes were broken (``_break``), and what its launcher said."""

    out: Path
    returncode: int
    stderr: str
    scope: str  # BASIN_TEST_SCOPE of the run's processes
    summary: dict  # summary.json as the launcher left it (a resume rewrites it)
    statuses: list[str]  # results.csv's round-status column then
    resumed: subprocess.CompletedProcess | None  # the same command again, where it was run


def _break(settings: dict, signum: signal.Signals, after_round: int, folder: Path, resume: bool) -> Ended:
    """Launch the run of ``settings`` in ``folder``, send ``signum`` to its client processes
    (SIGKILL: all of them; SIGSTOP: one) once round ``after_round`` is written, wait for the
    launcher to end; with ``resume``, run the same command again."""
    out = folder / "run"
    scope = uuid.uuid4().hex
    env = {**os.environ, SCOPE_VARIABLE: scope, "PYTHONPATH": str(APP_DIR)}
    launcher = subprocess.Popen(_command(out, settings), cwd=APP_DIR, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, env=env)
    try:
        clients = _client_processes_after(out, launcher, after_round)
        for pid in clients if signum == signal.SIGKILL else clients[:1]:  # they, not the launcher
            os.kill(pid, signum)
        _, err = launcher.communicate(timeout=240)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    summary = json.loads((out / "summary.json").read_text())
    statuses = pd.read_csv(out / "results.csv")["round-status"].tolist()
    resumed = None
    if resume:
        resumed = subprocess.run(_command(out, settings), cwd=APP_DIR, capture_output=True, text=True, timeout=300, env=env)
    return Ended(out, launcher.returncode, err, scope, summary, statuses, resumed)


@pytest.fixture(scope="module")
def broken_runs(tmp_path_factory) -> dict[str, Ended]:
    """The two runs at once: each alone leaves about half of 2 cores idle (its client
    processes' start, the frozen one's round-timeout)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        killed = pool.submit(_break, SETTINGS, signal.SIGKILL, 3, tmp_path_factory.mktemp("killed"), True)
        frozen = pool.submit(_break, FROZEN, signal.SIGSTOP, 2, tmp_path_factory.mktemp("frozen"), False)
        return {"killed": killed.result(), "frozen": frozen.result()}


@UNINTERRUPTED
def test_client_processes_killed_mid_run_stop_it_without_a_skipped_round_and_it_resumes_exactly(broken_runs, flower_runs):
    ended = broken_runs["killed"]
    out = ended.out
    assert ended.returncode == 1, ended.stderr[-2000:]
    summary = ended.summary
    assert summary["status"] == "failed" and "clients failed because their processes died" in summary["error"], summary
    assert set(ended.statuses) == {"aggregated"}  # the lost round is not recorded as a skipped one
    assert summary["rounds-skipped"] == 0

    resumed = ended.resumed
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming {out} after round " in resumed.stderr  # on the terminal, not only in flwr.log
    rows, final = _uninterrupted(flower_runs)
    results = pd.read_csv(out / "results.csv")
    assert results["round"].tolist() == list(range(1, SETTINGS["num-rounds"] + 1))
    pd.testing.assert_frame_equal(results.drop(columns=TIMING_COLUMNS), rows.drop(columns=TIMING_COLUMNS), check_exact=True)
    model = torch.load(out / "final_model.pt", weights_only=True)
    assert all(torch.equal(model[k], final[k]) for k in final)
    assert processes_in_scope(ended.scope) == set()


def test_a_frozen_client_process_fails_its_round_after_round_timeout_and_the_run_completes(broken_runs):
    """A ClientApp process stopped with SIGSTOP (hung, not dead) after round 2: the round
    it held ends after `round-timeout`, counting it as one failure; the run completes on
    the other client process and nothing of it is left."""
    ended = broken_runs["frozen"]
    assert ended.returncode == 0, ended.stderr[-2000:]
    rows = pd.read_csv(ended.out / "results.csv")
    assert rows["clients-failed"].sum() >= 1 and (rows["round-status"] == "aggregated").all()
    later = rows[rows["round"] > 2]  # round 1 also waits for the client processes to start (node-timeout)
    assert (later["round-seconds"] < FROZEN["round-timeout"] + 3).all()  # bounded by round-timeout
    assert "no reply within round-timeout" in ";".join(rows["failures"].dropna().astype(str))
    assert processes_in_scope(ended.scope) == set()
