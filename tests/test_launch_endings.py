"""However a launch ends, its summary.json says how: never "running" once the launcher is
done with it (experiments/runtime/launch.py). Flower is replaced by a process that waits,
and following the run by a function that records a round, then ends as injected."""

from __future__ import annotations

import json
import sys

import pytest

from experiments.runtime import launch as launching
from experiments.runtime.processes import processes_of_home
from experiments.runtime.ray_cluster import RayClusterUnreachable
from experiments.runtime.run_config import resolve_config
from experiments.runtime.warm_processes import WARM_SIMULATION_SWITCH

ENDINGS = {
    "ctrl-c": (KeyboardInterrupt(), "interrupted",
               "interrupted at round 1 of 5 (Ctrl-C or SIGTERM): run the same command again to resume"),
    "cluster": (RayClusterUnreachable("the job's Ray cluster did not start within 120 s"), "failed",
                "the launcher stopped following the run: RayClusterUnreachable: the job's Ray cluster did not start"),
    "log-read": (OSError(5, "Input/output error"), "failed",
                 "the launcher stopped following the run: OSError: [Errno 5] Input/output error"),
    "bug": (ZeroDivisionError("division by zero"), "failed",
            "the launcher stopped following the run: ZeroDivisionError: division by zero"),
}


@pytest.mark.parametrize("way", ENDINGS)
def test_every_way_a_launch_ends_is_recorded_and_the_error_goes_on(tmp_path, monkeypatch, way):
    error, status, reason = ENDINGS[way]
    homes = []

    def follow_run(process, out_dir, *args, **kwargs):
        homes.append(process.args)
        (out_dir / "results.csv").write_text("round,test-accuracy\n1,0.5\n")
        (out_dir / "summary.json").write_text(json.dumps({"status": "running"}))  # as the ServerApp writes it
        raise error

    monkeypatch.setattr(launching, "FLWR_COMMAND", (sys.executable, "-c", "import time; time.sleep(60)"))
    monkeypatch.setattr(launching, "follow_run", follow_run)
    monkeypatch.setenv(WARM_SIMULATION_SWITCH, "off")
    config = resolve_config({"num-rounds": 5, "num-clients": 2, "participation": 1.0})
    with pytest.raises(type(error)):
        launching.launch(config, tmp_path / "run", progress=False)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == status and summary["error"].startswith(reason), summary
    assert summary["rounds"] == 1
    assert homes and not processes_of_home(tmp_path)  # nothing of the launch runs on


def test_a_run_that_ended_without_a_word_is_killed_with_the_reason_from_flowers_log(tmp_path):
    from experiments.runtime.run_config import default_run_config
    from experiments.runtime.run_endings import run_failure
    from strategies.results import RunRecorder

    config = default_run_config()
    recorder = RunRecorder(tmp_path, config, last_k=10, target=0.9)  # summary.json: "running"
    for server_round, accuracy in ((1, 0.5), (2, 0.7)):
        recorder.append({"round": server_round, "test-accuracy": accuracy, "round-status": "aggregated", "clients-failed": 0})
    log = tmp_path / "flwr.log"
    log.write_text("\x1b[92mINFO \x1b[0m:      Starting Flower Simulation\n"
                   "\x1b[91mERROR \x1b[0m:     No actor could be created: empty actor pool\n"
                   "\x1b[92mINFO \x1b[0m:      Stopping\n")
    error = run_failure(tmp_path, config, log)
    assert str(error).splitlines()[0] == f"run in {tmp_path} failed: No actor could be created: empty actor pool"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "killed" and summary["rounds"] == 2 and summary["acc-last-k"] == pytest.approx(0.6)

    log.write_text("Starting local SuperLink\n[basin] round 2/30 accuracy 0.7\n")
    assert "ended after round 2 without recording why" in str(run_failure(tmp_path, config, log)).splitlines()[0]
    recorder.fail(ValueError("bad"))  # the ServerApp's own error wins
    assert str(run_failure(tmp_path, config, log)).splitlines()[0].endswith("failed: ValueError: bad")


def test_a_serverapp_that_started_then_died_is_noticed_though_flowers_log_lags(tmp_path):
    """Under load `flwr run --stream` had delivered none of the ServerApp's lines after its
    third round (a fresh clone's CI, 2026-11-30), and the launcher only watched the
    ServerApp's process once its start-up line was in the log: the dead ServerApp went
    unnoticed until `flwr run` gave up. The summary it writes as it starts says so too."""
    import subprocess

    from experiments.runtime.flower_log import follow_run

    (tmp_path / "flwr.log").write_text("Starting local SuperLink\n")  # nothing of the ServerApp's yet
    (tmp_path / "summary.json").write_text(json.dumps({"status": "running"}))  # as the ServerApp writes it
    flwr_run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        follow_run(flwr_run, tmp_path, 5, progress=False, label="", leave=False, server_alive=lambda: False)
        assert flwr_run.poll() is None  # it returned on the ServerApp's death, not when `flwr run` ended
    finally:
        flwr_run.kill()
        flwr_run.wait()
