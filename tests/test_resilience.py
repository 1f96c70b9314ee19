"""Real `flwr run` jobs that must survive faults: misbehaving clients, and a ServerApp
killed with SIGKILL that is started again and continues from its checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

from experiments.launch import APP_DIR, _process_table, launch, process_tree, resolve_config, stop_process_tree
from strategies.checkpoint import CHECKPOINT_FILE

# Wall-clock columns differ between any two runs; everything else must match exactly.
TIMING_COLUMNS = ["round-seconds", "train-seconds", "eval-seconds", "client-seconds"]


def test_faulty_clients_are_excluded_counted_and_never_hang_the_run(tmp_path):
    config = resolve_config({
        "num-clients": 4, "participation": 1.0, "num-rounds": 3, "local-epochs": 1, "device": "cpu",
        "round-timeout": 8.0, "min-replies": 2,
        # Round 1: a client raises, one returns NaN. Round 2: one returns a misshapen array,
        # one hangs past the round timeout. Round 3: only one client is fine -> skipped.
        "fault-injection": "raise:0@1, nan:1@1, shape:2@2, hang:3@2, raise:0@3, inf:1@3, raise:2@3",
    })
    started = time.monotonic()
    summary = launch(config, tmp_path / "run", progress=False)
    rows = pd.read_csv(tmp_path / "run" / "results.csv")
    assert summary["status"] == "completed" and summary["rounds"] == 3
    assert summary["rounds-skipped"] == 1 and summary["client-failures"] == 7
    assert time.monotonic() - started < 120  # the hung client cost one round-timeout, not forever
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


KILLABLE_LAUNCH = "import json, sys; from pathlib import Path; from experiments.launch import launch; " \
    "launch(json.loads(sys.argv[1]), Path(sys.argv[2]), progress=False)"


def _rows(path) -> int:
    try:
        return max(len(path.read_text().splitlines()) - 1, 0)
    except OSError:
        return 0


@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_from_its_checkpoint_bitwise_identically(tmp_path):
    config = resolve_config({
        "num-clients": 4, "participation": 0.5, "num-rounds": 6, "local-epochs": 1, "device": "cpu",
        "strategy": "fedadam", "server-lr": 0.05, "averaging": "ima", "window": 2, "avg-start": 3,
        "checkpoint-every": 2,
    })
    launch(config, tmp_path / "uninterrupted", progress=False)
    rows = pd.read_csv(tmp_path / "uninterrupted" / "results.csv")
    # FedAdam+IMA: the window fills from round 2 (t_s − P + 1), the average is sent from t_s = 3 on.
    assert rows["sent-model"].tolist() == ["base", "base"] + ["averaged"] * 4
    assert rows["averaged-accuracy"].isna().tolist() == [True, True] + [False] * 4
    assert (rows["test-accuracy"][2:] == rows["averaged-accuracy"][2:]).all()
    # Mild exploration: ×0.97 per round after t_s on top of the base decay.
    assert rows["lr"][3] == pytest.approx(0.05 * 0.99**2 * 0.97)

    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(APP_DIR)}
    launcher = subprocess.Popen([sys.executable, "-c", KILLABLE_LAUNCH, json.dumps(config), str(killed)], cwd=APP_DIR, env=env)
    try:
        deadline = time.monotonic() + 180
        while _rows(killed / "results.csv") < 3:  # round 2's checkpoint is written, round 3 is done
            assert time.monotonic() < deadline and launcher.poll() is None, "the run to kill never reached round 3"
            time.sleep(0.05)
        table = _process_table()
        server = [pid for pid in process_tree([launcher.pid], table) if "flwr-simulation" in table[pid][2]]
        assert len(server) == 1
        os.kill(server[0], signal.SIGKILL)  # the ServerApp dies mid-run, with its in-memory state
        rows_at_kill = _rows(killed / "results.csv")
    finally:
        stop_process_tree([launcher.pid])
        launcher.wait()
    assert json.loads((killed / "summary.json").read_text())["status"] != "completed"
    checkpoint_round = torch.load(killed / CHECKPOINT_FILE, weights_only=True)["round"]
    assert checkpoint_round in (2, 4) and checkpoint_round <= rows_at_kill < 6

    summary = launch(config, killed, progress=False)  # the same command again
    assert summary["status"] == "completed" and summary["resumed-after-round"] == checkpoint_round
    resumed = pd.read_csv(killed / "results.csv").drop(columns=TIMING_COLUMNS)
    uninterrupted = pd.read_csv(tmp_path / "uninterrupted" / "results.csv").drop(columns=TIMING_COLUMNS)
    pd.testing.assert_frame_equal(resumed, uninterrupted, check_exact=True)
    final = torch.load(killed / "final_model.pt", weights_only=True)
    expected = torch.load(tmp_path / "uninterrupted" / "final_model.pt", weights_only=True)
    assert final.keys() == expected.keys() and all(torch.equal(final[k], expected[k]) for k in final)
