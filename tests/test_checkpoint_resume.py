"""Real `flwr run` jobs that must survive faults: misbehaving clients, and a ServerApp
killed with SIGKILL that is started again and continues from its checkpoint."""

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

from clients.state_store import CLIENT_STATE_DIR
from experiments.runtime.launch import launch
from experiments.runtime.machine import ClientResources, gpu_memory_advice
from experiments.runtime.processes import process_table, process_tree, stop_process_tree
from experiments.runtime.run_config import APP_DIR
from experiments.runtime.run_endings import RunFailed
from strategies.checkpoint import CHECKPOINT_FILE
from strategies.model_store import load_round_models, saved_rounds

# Wall-clock columns differ between any two runs; everything else must match exactly.
TIMING_COLUMNS = ["round-seconds", "train-seconds", "eval-seconds", "client-seconds"]


# Round 1: a client raises, one returns NaN. Round 2: one returns a misshapen array, one hangs
# past the round timeout. Round 3: only one client is fine -> skipped. The hung client's round
# waits round-timeout: 4 s, as the frozen client's test (tests/test_client_process_death.py)
# waits; the healthy replies come in under a second. Launched with the session's other runs
# (tests/conftest.py's flower_runs), whose work fills that wait (alone the run left half of 2 cores idle).
FAULTY_CLIENTS = {"num-clients": 4, "participation": 1.0, "num-rounds": 3, "local-epochs": 1, "device": "cpu",
                  "round-timeout": 4.0, "min-replies": 2,
                  "fault-injection": "raise:0@1, nan:1@1, shape:2@2, hang:3@2, raise:0@3, inf:1@3, raise:2@3"}


@pytest.mark.slow
@pytest.mark.flower_runs("faulty-clients")
def test_faulty_clients_are_excluded_counted_and_never_hang_the_run(flower_runs):
    run = flower_runs["faulty-clients"]
    summary, rows = run.summary, run.rows()
    assert summary["status"] == "completed" and summary["rounds"] == 3
    assert summary["rounds-skipped"] == 1 and summary["client-failures"] == 7
    assert summary["run-seconds"] < 120  # the hung client cost one round-timeout, not forever
    assert rows["clients-ok"].tolist() == [2, 2, 1] and rows["clients-failed"].tolist() == [2, 2, 3]
    first, second, third = rows["failures"]
    assert "partition 0 (node " in first and "client error: injected fault: partition 0 raises in round 1" in first
    assert "partition 1 (node " in first and "non-finite values (NaN or inf)" in first
    assert "partition 2 (node " in second and "has shape (4095,), sent (64, 64)" in second
    assert "partition 3 (node " in second and "no reply within round-timeout" in second
    assert len(third.split("; ")) == 3
    assert rows["round-status"].tolist()[:2] == ["aggregated", "aggregated"]
    assert rows["round-status"][2] == "skipped: 1 accepted replies, fewer than min-replies = 2"
    # A skipped round leaves the global model as it was.
    assert rows["test-accuracy"][2] == rows["test-accuracy"][1] and rows["test-loss"][2] == rows["test-loss"][1]


# The launcher to kill keeps its temporary files (Flower's home) in argv[3], inside the test's
# tmp_path: killed, it cannot remove them itself.
KILLABLE_LAUNCH = "import json, sys, tempfile; from pathlib import Path; from experiments.runtime.launch import launch; " \
    "tempfile.tempdir = sys.argv[3]; launch(json.loads(sys.argv[1]), Path(sys.argv[2]), progress=False)"


def _rows(path) -> int:
    try:
        return max(len(path.read_text().splitlines()) - 1, 0)
    except OSError:
        return 0


# Both compose IMA (its window) with a stateful server: FedAdam's moments; SCAFFOLD's
# server control c and, on the clients, each c_i (restored from the clients' snapshots;
# plain local SGD as in the paper). 2 of 4 clients per round, checkpoints every 2 rounds.
RESUMED_METHODS = {
    "fedadam+ima": {"strategy": "fedadam", "server-lr": 0.05},
    "scaffold+ima": {"strategy": "scaffold", "momentum": 0.0, "lr": 0.1},
}
RESUMED_SETTINGS = {"num-clients": 4, "participation": 0.5, "num-rounds": 10, "local-epochs": 1, "device": "cpu",
                    "averaging": "ima", "window": 2, "avg-start": 3, "checkpoint-every": 2, "save-models-every": 2}


# On the CPU, a client raising torch's CUDA out-of-memory error (fault-injection 'oom'), as
# one of a cohort too large for its GPU does (tests/conftest.py's flower_runs).
OUT_OF_GPU_MEMORY = {"num-clients": 2, "participation": 1.0, "num-rounds": 3, "local-epochs": 1, "device": "cpu",
                     "checkpoint-every": 1, "fault-injection": "oom:1@2"}
# Each method's uninterrupted run, which the resumed one must equal, and the run whose client
# runs out of GPU memory (tests/conftest.py's flower_runs).
FLOWER_RUNS = {**{f"{method}-uninterrupted": {**RESUMED_SETTINGS, **settings} for method, settings in RESUMED_METHODS.items()},
               "client-out-of-gpu-memory": OUT_OF_GPU_MEMORY, "faulty-clients": FAULTY_CLIENTS}


@pytest.mark.slow
@pytest.mark.flower_runs("client-out-of-gpu-memory")
def test_a_client_out_of_gpu_memory_stops_the_run_with_its_checkpoint_saying_what_to_lower(flower_runs):
    """The run stops after the last complete round, with its checkpoint, naming the error and
    the option to change."""
    run = flower_runs["client-out-of-gpu-memory"]
    with pytest.raises(RunFailed) as failed:
        run.completed()
    message = str(failed.value)
    assert "round 2: a client process ran out of GPU memory (partition 1" in message
    assert "CUDA out of memory. Tried to allocate" in message and "--gpus-per-client" in message
    assert pd.read_csv(run.out / "results.csv")["round"].tolist() == [1]
    assert torch.load(run.out / CHECKPOINT_FILE, weights_only=False)["round"] == 1
    assert json.loads((run.out / "summary.json").read_text())["status"] == "failed"


def test_the_launcher_says_how_many_processes_shared_the_gpu_and_what_to_try():
    summary = {"status": "failed", "error": "ClientOutOfGpuMemory: round 2: a client process ran out of GPU memory"}
    assert gpu_memory_advice(summary, ClientResources(1.0, 0.125)) == (
        "\n8 client processes shared the GPU (--gpus-per-client 0.125); try --gpus-per-client 0.25 (4 processes)")
    assert gpu_memory_advice(summary, ClientResources(1.0, 1.0)).endswith("try --gpus-per-client 1 (1 processes)")
    assert gpu_memory_advice({"error": "something else"}, ClientResources(1.0, 0.5)) == ""
    assert gpu_memory_advice(summary, ClientResources(1.0, 0.0)) == ""  # the CPU: no GPU share to change


@dataclass
class Killed:
    """One method's run whose ServerApp was killed after round 3 (``_kill_server_and_resume``):
    what the kill left, read before the same command ran again; then that command's summary."""

    out: Path
    rows_at_kill: int
    summary: dict  # summary.json once the launcher had ended
    checkpoint: dict
    snapshots: list[str]  # the client-state snapshots' folder names
    resumed: dict  # the summary of the same command, run again


def _kill_server_and_resume(config: dict, folder: Path) -> Killed:
    """Launch ``config`` in ``folder`` (a launcher process of its own), SIGKILL its ServerApp's
    process once round 3 is recorded, see the launcher end within 30 s, read what was left;
    then run the same command again (here: its launch)."""
    killed = folder / "killed"
    env = {**os.environ, "PYTHONPATH": str(APP_DIR)}
    scratch = folder / "launcher-tmp"
    scratch.mkdir()
    launcher = subprocess.Popen([sys.executable, "-c", KILLABLE_LAUNCH, json.dumps(config), str(killed), str(scratch)],
                                cwd=APP_DIR, env=env)
    try:
        deadline = time.monotonic() + 240
        server: list[int] = []
        while not server:  # the ServerApp's process, found before the rounds start (they take ~0.03 s each)
            assert time.monotonic() < deadline and launcher.poll() is None, "the run to kill never started"
            table = process_table()
            server = [pid for pid in process_tree([launcher.pid], table) if "flwr-simulation" in table[pid][2]]
            time.sleep(0.05)
        assert len(server) == 1
        while _rows(killed / "results.csv") < 3:  # round 2's checkpoint is written, round 3 is done
            assert time.monotonic() < deadline and launcher.poll() is None, "the run to kill never reached round 3"
            time.sleep(0.002)
        os.kill(server[0], signal.SIGKILL)  # the ServerApp dies mid-run, with its in-memory state
        rows_at_kill = _rows(killed / "results.csv")
        # The launcher notices within seconds (`flwr run` alone would wait about a minute).
        assert launcher.wait(timeout=30) == 1
    finally:
        stop_process_tree([launcher.pid])
        launcher.wait()
    checkpoint = torch.load(killed / CHECKPOINT_FILE, weights_only=True)
    snapshots = sorted(p.name for p in (killed / CLIENT_STATE_DIR / checkpoint["client-state-run"]).glob("partition-*"))
    summary = json.loads((killed / "summary.json").read_text())
    return Killed(killed, rows_at_kill, summary, checkpoint, snapshots, launch(config, killed, progress=False))


# The methods' runs are killed and resumed two at once: one such run leaves part of the
# 2 cores idle (its start-up, the launcher's wait for the dead ServerApp). Both tests with
# their references took 37 s so, against 45 s one after the other (2 cores, 2026-12-05).
@pytest.fixture(scope="module")
def killed_runs(request, flower_runs, tmp_path_factory) -> dict[str, Future]:
    """``_kill_server_and_resume`` for each method this session's selected tests name, all at once."""
    selected = [item.callspec.params["method"] for item in request.session.items
                if item.originalname == "test_a_run_killed_with_sigkill_resumes_from_its_checkpoint_bitwise_identically"]
    with ThreadPoolExecutor(max_workers=len(RESUMED_METHODS)) as pool:
        return {method: pool.submit(_kill_server_and_resume, flower_runs[f"{method}-uninterrupted"].config,
                                    tmp_path_factory.mktemp(method.replace("+", "-") + "-killed"))
                for method in selected}


@pytest.mark.slow
@pytest.mark.parametrize("method", [pytest.param(method, marks=pytest.mark.flower_runs(f"{method}-uninterrupted"))
                                    for method in RESUMED_METHODS])
def test_a_run_killed_with_sigkill_resumes_from_its_checkpoint_bitwise_identically(killed_runs, flower_runs, method):
    reference = flower_runs[f"{method}-uninterrupted"]
    config = reference.config
    uninterrupted = reference.completed()
    run = killed_runs[method].result()
    killed = run.out
    assert run.summary["status"] == "killed" and "ServerApp's process ended" in run.summary["error"]
    checkpoint = run.checkpoint
    assert checkpoint["round"] in (2, 4, 6, 8) and checkpoint["round"] <= run.rows_at_kill < 10
    # Only SCAFFOLD's clients keep state; each of them snapshots it after every round it trains in.
    assert run.snapshots == ([f"partition-{k}" for k in range(4)] if method == "scaffold+ima" else [])

    summary = run.resumed  # the same command again
    assert summary["status"] == "completed" and summary["resumed-after-round"] == checkpoint["round"]
    resumed = pd.read_csv(killed / "results.csv").drop(columns=TIMING_COLUMNS)
    rows = pd.read_csv(uninterrupted / "results.csv")
    pd.testing.assert_frame_equal(resumed, rows.drop(columns=TIMING_COLUMNS), check_exact=True)
    final = torch.load(killed / "final_model.pt", weights_only=True)
    expected = torch.load(uninterrupted / "final_model.pt", weights_only=True)
    assert final.keys() == expected.keys() and all(torch.equal(final[k], expected[k]) for k in final)
    assert not (killed / CLIENT_STATE_DIR).exists()  # a completed run leaves no snapshots
    # Saved models follow the checkpoint: the rounds after it were saved again, identically.
    assert saved_rounds(killed) == saved_rounds(uninterrupted) == [2, 4, 6, 8, 9, 10]
    for server_round in (2, 4, 6, 8, 9, 10):
        ours, theirs = (load_round_models(d, server_round) for d in (killed, uninterrupted))
        assert list(ours["clients"]) == list(theirs["clients"]) and ours["client-weights"] == theirs["client-weights"]
        for part in ("base", "averaged"):
            assert (ours[part] is None) == (theirs[part] is None)
            assert ours[part] is None or all(torch.equal(ours[part][k], theirs[part][k]) for k in ours[part])
        for pid in ours["clients"]:
            assert all(torch.equal(ours["clients"][pid][k], theirs["clients"][pid][k]) for k in ours["clients"][pid])

    # IMA on either base: the window fills from round 2 (t_s − P + 1), the average is sent from t_s = 3 on.
    assert rows["sent-model"].tolist() == ["base", "base"] + ["averaged"] * 8
    assert rows["averaged-accuracy"].isna().tolist() == [True, True] + [False] * 8
    assert (rows["test-accuracy"][2:] == rows["averaged-accuracy"][2:]).all()
    # Mild exploration: ×0.97 per round after t_s on top of the base decay.
    assert rows["lr"][3] == pytest.approx(config["lr"] * 0.99**2 * 0.97)
    if method == "scaffold+ima":
        # c_i is 0 in round 1 and carried across rounds: from round 3 on (2 of 4 clients per
        # round), every cohort holds a client that trained before.
        assert rows["client-state-norm"][0] == 0.0 and rows["client-state-norm"][2:].gt(0).all()
        assert rows["test-accuracy"].iloc[-1] > 0.3  # learning (chance is 0.1)
