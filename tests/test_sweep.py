"""The sweep runner: grid expansion and validation, resumable execution, failed runs, and
a real 8-run digits sweep that is interrupted and resumed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import flower_logs_of_unfinished, processes_in_scope

from experiments import sweep as sweep_module
from experiments.runtime import sweep_runs
from experiments.runtime.processes import ray_sessions
from experiments.runtime.run_endings import RunFailed
from experiments.runtime.sweep_definition import SWEEP_FILES_DIR, SweepError, load_sweep
from experiments.runtime.sweep_runs import collect, run_sweep
from strategies.checkpoint import CHECKPOINT_FILE, load_checkpoint
from strategies.config import ConfigError

REPO = Path(__file__).resolve().parents[1]
SMALL = """
[set]
num-clients = 4
participation = 0.5
num-rounds = 2
local-epochs = 1
device = "cpu"
"""


# The interrupted sweep's fourth run (below), launched with the session's other reference
# runs (tests/conftest.py): a run of the resumed parallel pair must give its bits.
FLOWER_RUNS = {"sweep-fourth-run": {"num-clients": 4, "participation": 0.5, "num-rounds": 4, "checkpoint-every": 1,
                                    "local-epochs": 4, "batch-size": 4, "device": "cpu", "alpha": 1.0, "averaging": "ima",
                                    "window": 2, "avg-start": 2, "seed": 0}}


def write_sweep(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


def test_grid_is_every_combination_with_readable_ids_and_coupled_keys(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path, SMALL + """
[resources]
num-gpus = 0.25
[grid]
alpha = [0.1, 1.0]
method = [{strategy = "fedavg"}, {strategy = "fedprox", prox-mu = 0.1}]
seed = [0, 1]
"""))
    assert len(sweep.runs) == 8 and sweep.resources.num_gpus == 0.25 and sweep.name == "sweep"
    assert sweep.runs[0].run_id == "alpha=0.1_strategy=fedavg_seed=0"
    assert sweep.runs[3].run_id == "alpha=0.1_strategy=fedprox+prox-mu=0.1_seed=1"
    last = sweep.runs[-1].config
    assert (last["alpha"], last["strategy"], last["prox-mu"], last["seed"], last["num-rounds"]) == (1.0, "fedprox", 0.1, 1, 2)


def test_grid_points_with_the_same_config_run_once(tmp_path):
    # The window does not change a run without averaging... but it is part of the config,
    # so only truly identical configs are merged: here strategy given twice.
    sweep = load_sweep(write_sweep(tmp_path, SMALL + """
[grid]
method = [{strategy = "fedavg"}, {strategy = "fedavg", seed = 0}]
"""))
    assert len(sweep.runs) == 1 and sweep.duplicates == 1


@pytest.mark.parametrize(
    "text, error, match",
    [
        ("[grid]\nalpha = [0.1]\n[extra]\nx = 1\n", SweepError, "unknown key.*extra"),
        ("[grid]\nalpha = 0.1\n", SweepError, r"\[grid\] alpha = 0.1 .*non-empty list"),
        ("[set]\nnum-rounds = 2\n", SweepError, r"\[grid\] is missing"),
        ("[resources]\nnum-gpu = 1\n[grid]\nseed = [0]\n", SweepError, "num-gpu"),
        ("[resources]\nnum-cpus = 0.5\n[grid]\nseed = [0]\n", SweepError, r"num-cpus per client = 0.5 .* a whole number >= 1"),
        ("[grid]\nalpha = [0.1, -1.0]\n", ConfigError, "run alpha=-1.0: .*'alpha' = -1.0"),
        ("[grid]\nstrategy = ['fedavg', 'fedavgg']\n", ConfigError, "'strategy' = 'fedavgg'.*allowed"),
        ("[grid]\nseed = [0, 0]\n", SweepError, "repeats a value"),
        # An infeasible partition cell is refused at validation, naming the run, α, K and the minimum.
        ("[set]\nparticipation = 0.1\n[grid]\nnum-clients = [10, 500]\n", ConfigError,
         r"run num-clients=500: .*Dirichlet\(alpha=0.3\) over num-clients = 500 with min-partition-size = 10"),
    ],
)
def test_bad_sweep_files_are_refused_naming_the_key(tmp_path, text, error, match):
    with pytest.raises(error, match=match):
        load_sweep(write_sweep(tmp_path, text))


def test_bad_sweep_exits_2_before_anything_starts(tmp_path, capsys):
    path = write_sweep(tmp_path, "[grid]\nparticipation = [0.5, 2.0]\n")
    assert sweep_module.main([str(path), "--out", str(tmp_path / "out")]) == 2
    assert "'participation' = 2.0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("path", sorted(SWEEP_FILES_DIR.glob("*.toml")), ids=lambda p: p.stem)
def test_every_sweep_preset_resolves(path):
    sweep = load_sweep(path)
    assert sweep.runs and sweep.duplicates == 0
    assert len({run.run_id for run in sweep.runs}) == len(sweep.runs)


def fake_launch(fail_ids: set[str], calls: list[str]):
    """A stand-in for a Flower run: writes summary and results, or fails."""
    def launch(config, out_dir, resources, progress, label, leave, ray_address=None, stop=None):
        calls.append(label)
        out_dir.mkdir(parents=True)
        if label in fail_ids:
            raise RunFailed(f"run in {out_dir} failed: ValueError: boom\n--- last lines ---")
        accuracy = 0.5 + config["seed"] / 10
        (out_dir / "results.csv").write_text(f"round,test-accuracy\n1,{accuracy - 0.1}\n2,{accuracy}\n")
        summary = {"status": "completed", "rounds": 2, "last-k": 10, "last-10-accuracy": accuracy - 0.05,
                   "best-accuracy": accuracy, "best-round": 2, "final-accuracy": accuracy,
                   "round-reaching-target": None, "wall-seconds": 1.0}
        (out_dir / "summary.json").write_text(json.dumps(summary))
        return summary
    return launch


def test_failed_runs_are_recorded_and_skipped_on_resume_unless_retried(tmp_path, monkeypatch):
    sweep = load_sweep(write_sweep(tmp_path, SMALL + "[grid]\nseed = [0, 1, 2]\n"))
    calls: list[str] = []
    monkeypatch.setattr(sweep_runs, "launch", fake_launch({"seed=1"}, calls))
    table = run_sweep(sweep, tmp_path / "out", progress=False)
    assert calls == ["seed=0", "seed=1", "seed=2"]  # the failure did not stop the sweep
    assert table["status"].tolist() == ["completed", "failed", "completed"]
    assert table["error"].tolist() == ["", f"run in {tmp_path / 'out' / 'runs' / 'seed=1'} failed: ValueError: boom", ""]
    assert table["acc-last-k"].tolist()[::2] == pytest.approx([0.45, 0.65])
    assert pd.read_csv(tmp_path / "out" / "results.csv")["status"].tolist() == table["status"].tolist()

    calls.clear()
    run_sweep(sweep, tmp_path / "out", progress=False)
    assert calls == []  # finished runs, failed included, are not run again
    table = run_sweep(sweep, tmp_path / "out", retry_failed=True, progress=False)
    assert calls == ["seed=1"] and table["status"].eq("failed").sum() == 1


def test_parallel_runs_finish_every_run_and_ctrl_c_stops_the_running_ones(tmp_path, monkeypatch):
    path = write_sweep(tmp_path, SMALL + "[grid]\nseed = [0, 1, 2, 3]\n")
    calls: list[str] = []
    monkeypatch.setattr(sweep_runs, "launch", fake_launch(set(), calls))
    table = run_sweep(load_sweep(path), tmp_path / "out", progress=False, parallel=3)
    assert sorted(calls) == [f"seed={k}" for k in range(4)] and table["status"].eq("completed").all()
    assert table["run"].tolist() == [f"seed={k}" for k in range(4)]  # the table keeps the sweep's order

    stopped, seed_1_started = [], threading.Event()

    def interrupted_launch(config, out_dir, resources, progress, label, leave, ray_address=None, stop=None):
        out_dir.mkdir(parents=True)
        if label == "seed=0":
            # Not before seed=1 runs: on a loaded machine its thread may not have started yet.
            assert seed_1_started.wait(timeout=30)
            raise KeyboardInterrupt  # as Ctrl-C reaches the sweep while seed=1 runs beside
        seed_1_started.set()
        assert stop.wait(timeout=30), "the other run was never told to stop"
        stopped.append(label)
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_runs, "launch", interrupted_launch)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(load_sweep(path), tmp_path / "again", progress=False, parallel=2)
    # seed=1 ran beside seed=0; seed=2 may have started in seed=0's thread before the stop.
    assert "seed=1" in stopped and set(stopped) <= {"seed=1", "seed=2"}
    assert not list((tmp_path / "again" / "runs").glob("*/outcome.json"))  # nothing finished: all pending


def test_a_run_whose_flower_died_with_the_interrupt_is_interrupted_and_resumes_not_failed(tmp_path, monkeypatch):
    """`timeout` and a terminal's Ctrl-C signal the whole process group: `flwr run` dies
    beside the launcher, and the run in another thread then ends as a RunFailed ("killed …")
    once the sweep is told to stop. It was recorded failed (report: "not run: failed: …"),
    and the same command did not run it again."""
    path = write_sweep(tmp_path, SMALL + "[grid]\nseed = [0, 1]\n")

    seed_1_started = threading.Event()

    def launch_dying_with_the_group(config, out_dir, resources, progress, label, leave, ray_address=None, stop=None):
        out_dir.mkdir(parents=True)
        if label == "seed=0":
            assert seed_1_started.wait(timeout=30)  # seed=1 runs beside (its thread may start late)
            raise KeyboardInterrupt  # the launcher's own interrupt
        seed_1_started.set()
        assert stop.wait(timeout=30)
        (out_dir / "results.csv").write_text("round,test-accuracy\n1,0.5\n2,0.6\n")
        (out_dir / "summary.json").write_text(json.dumps({"status": "killed", "error": "the ServerApp's process ended"}))
        raise RunFailed(f"run in {out_dir} failed: the ServerApp's process ended after round 2 without recording why")

    monkeypatch.setattr(sweep_runs, "launch", launch_dying_with_the_group)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(load_sweep(path), out, progress=False, parallel=2)
    assert not (out / "runs" / "seed=1" / "outcome.json").exists()  # pending: the same command resumes it
    summary = json.loads((out / "runs" / "seed=1" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["error"].startswith("interrupted at round 2 of 2")
    table, _ = collect(load_sweep(path), out)
    assert table.set_index("run").loc["seed=1", ["status", "error"]].tolist() == [
        "pending", "interrupted at round 2 of 2 — run the same command to resume"]
    # A run under way (its summary says running, as in a parallel sweep's tables) is not called interrupted.
    (out / "runs" / "seed=0" / "summary.json").write_text(json.dumps({"status": "running", "rounds": 1}))
    assert collect(load_sweep(path), out)[0].set_index("run").loc["seed=0", "error"] == ""


def test_a_changed_config_reruns_and_an_unfinished_run_is_pending(tmp_path, monkeypatch):
    path = write_sweep(tmp_path, SMALL + "[grid]\nseed = [0, 1]\n")
    calls: list[str] = []
    monkeypatch.setattr(sweep_runs, "launch", fake_launch(set(), calls))
    run_sweep(load_sweep(path), tmp_path / "out", progress=False)
    # A run killed mid-way has a run directory but no outcome.json: pending, run again.
    (tmp_path / "out" / "runs" / "seed=1" / "outcome.json").unlink()
    table, curves = collect(load_sweep(path), tmp_path / "out")
    assert table["status"].tolist() == ["completed", "pending"] and set(curves["run"]) == {"seed=0"}
    calls.clear()
    run_sweep(load_sweep(path), tmp_path / "out", progress=False)
    assert calls == ["seed=1"]
    calls.clear()
    run_sweep(load_sweep(path, {"num-rounds": 3}), tmp_path / "out", progress=False)
    assert calls == ["seed=0", "seed=1"]


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # the process has exited meanwhile
        return ""


@pytest.mark.slow
@pytest.mark.flower_runs("sweep-fourth-run")
def test_a_real_sweep_interrupted_and_resumed_loses_and_repeats_nothing(flower_runs, tmp_path, scoped_env):
    """2 methods (FedAvg, FedAvg+IMA) × 2 α on digits, killed after the third run's first
    checkpoint, resumed: the finished runs are kept, the third continues from its checkpoint."""
    # Rounds of ~0.15 s (4 epochs of batches of 4): the signal lands before the third run ends.
    small = SMALL.replace("num-rounds = 2", "num-rounds = 4\ncheckpoint-every = 1")
    path = write_sweep(tmp_path, small.replace("local-epochs = 1", "local-epochs = 4\nbatch-size = 4") + """
[grid]
alpha = [0.1, 1.0]
averaging = ["none", {averaging = "ima", window = 2, avg-start = 2}]
seed = [0]
""")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "experiments.sweep", str(path), "--out", str(out), "--no-progress"]
    env, scope = scoped_env
    first = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    third = out / "runs" / "alpha=1.0_averaging=none_seed=0"
    deadline = time.monotonic() + 240
    second = None
    while time.monotonic() < deadline and not (third / CHECKPOINT_FILE).is_file():
        assert first.poll() is None, first.communicate()
        if second is None and (out / "runs").is_dir():  # the first holds the sweep's folder now
            # A second launcher on the same folder is refused at once, naming the first.
            second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
            assert second.returncode == 2 and f"in use by another Basin launcher (PID {first.pid})" in second.stderr
        time.sleep(0.05)
    started = processes_in_scope(scope)  # the scope sees this sweep's Flower and Ray processes
    assert any("flower-superlink" in _command_line(pid) for pid in started)
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 130 and "2 of 4 runs completed, 0 failed, 2 not finished" in err
    time.sleep(1)
    # No SuperLink, simulation or Ray process of this sweep is left (other jobs' do not count).
    assert processes_in_scope(scope) == set()

    table = pd.read_parquet(out / "results.parquet")
    assert table["status"].tolist() == ["completed"] * 2 + ["pending"] * 2
    assert second is not None
    interrupted = json.loads((third / "summary.json").read_text())
    assert interrupted["status"] == "interrupted" and interrupted["rounds"] >= 1  # not "running"
    # The signal may land a round or two after the first checkpoint (CI has 2 slow cores):
    # the resume must start from whichever round the last checkpoint holds.
    checkpointed_round = int(load_checkpoint(third / CHECKPOINT_FILE)["round"])
    assert 1 <= checkpointed_round < 4
    finished = {run: (out / "runs" / run / "outcome.json").stat().st_mtime_ns for run in table["run"][:2]}

    # Resumed with the last two runs at once (--parallel 2): the third continues from its
    # checkpoint beside the fourth, which starts from scratch.
    resumed = subprocess.run([*command, "--parallel", "2"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    table = pd.read_parquet(out / "results.parquet")
    assert len(table) == 4 and table["run"].is_unique and table["status"].eq("completed").all()
    assert table["acc-last-k"].between(0.1, 1).all() and table["rounds"].eq(4).all()
    # The runs finished before the interruption were not run again.
    assert {run: (out / "runs" / run / "outcome.json").stat().st_mtime_ns for run in finished} == finished
    assert json.loads((third / "summary.json").read_text())["resumed-after-round"] == checkpointed_round
    curves = pd.read_parquet(out / "curves.parquet")
    assert len(curves) == 16 and not curves.duplicated(["run", "round"]).any()
    assert pd.read_csv(out / "results.csv")["run"].tolist() == table["run"].tolist()

    # A run of the parallel pair gives, bit for bit, what it gives launched on its own.
    fourth, alone = load_sweep(path).runs[3], flower_runs["sweep-fourth-run"]
    assert fourth.config == alone.config
    columns = ["round", "lr", "test-accuracy", "test-loss", "averaged-accuracy", "train-loss", "clients-ok", "local-steps"]
    in_sweep = pd.read_csv(out / "runs" / fourth.run_id / "results.csv")[columns]
    pd.testing.assert_frame_equal(in_sweep, alone.rows()[columns], check_exact=True)
    model_in_sweep = torch.load(out / "runs" / fourth.run_id / "final_model.pt", weights_only=True)
    model_alone = torch.load(alone.completed() / "final_model.pt", weights_only=True)
    assert all(torch.equal(model_in_sweep[key], model_alone[key]) for key in model_alone)

    report = out / "report"
    assert "(+" in (report / "accuracy-table.md").read_text() or "(-" in (report / "accuracy-table.md").read_text()
    for figure in ["gain-vs-alpha.png", "curves-dir-0.1.png", "curves-dir-1.png"]:
        assert (report / figure).stat().st_size > 1000


def test_ima_methods_sweeps_cover_ima_table_1_with_the_papers_settings():
    for name in ("ima-fmnist-methods", "ima-cifar10"):
        sweep = load_sweep(SWEEP_FILES_DIR / f"{name}.toml")
        strategies = {run.config["strategy"] for run in sweep.runs}
        assert strategies == {"fedavg", "fedprox", "fedasam", "fednova", "fedadam", "fedyogi", "fedgma", "fedfa"}
        assert {run.config["fedfa-variant"] for run in sweep.runs} == {"fedfa-ima"}  # as IMA ran FedFA
        assert {run.config["averaging"] for run in sweep.runs} == {"none", "ima"}
        assert {run.config["prox-mu"] for run in sweep.runs} == {0.01}
        assert {run.config["server-lr"] for run in sweep.runs} == {0.0}  # FedGMA η_s = 1, FedAdam/Yogi 0.01
    cifar = load_sweep(SWEEP_FILES_DIR / "ima-cifar10.toml")
    # The IMA authors' CIFAR-10 pipeline: standardised, not augmented.
    assert {(run.config["augment"], run.config["normalize"]) for run in cifar.runs} == {("none", True)}
    for name in ("wima-cifar10", "wima-cifar100", "wima-cifar10-participation", "wima-cifar10-window",
                 "fedalign-cifar100-ablations", "fedswa-cifar100"):
        assert {run.config["augment"] for run in load_sweep(SWEEP_FILES_DIR / f"{name}.toml").runs} == {"crop-flip"}


def test_a_finished_sweep_run_again_has_nothing_pending_and_starts_no_ray(tmp_path, monkeypatch):
    from experiments.runtime.sweep_runs import _comparable, pending_runs

    sweep = load_sweep(write_sweep(tmp_path, SMALL + "[grid]\nseed = [0, 1]\n"))
    out = tmp_path / "out"
    assert [run.run_id for run in pending_runs(sweep, out)] == ["seed=0", "seed=1"]
    for run, status in zip(sweep.runs, ("completed", "failed")):
        (out / "runs" / run.run_id).mkdir(parents=True)
        (out / "runs" / run.run_id / "outcome.json").write_text(
            json.dumps({"status": status, "error": "", "run-seconds": 1.0, "config": _comparable(run.config)}))
    assert pending_runs(sweep, out) == []
    assert [run.run_id for run in pending_runs(sweep, out, retry_failed=True)] == ["seed=1"]

    started = []
    monkeypatch.setattr(sweep_runs.LocalRayCluster, "__enter__", lambda self: started.append(self.enabled) or None)
    monkeypatch.setattr(sweep_runs.LocalRayCluster, "__exit__", lambda self, *exc: None)
    sweep_module.main([str(tmp_path / "sweep.toml"), "--out", str(out), "--no-progress"])
    assert started == [False]  # nothing to run: no Ray cluster for the job


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_parallel_sweep_stopped_by_its_scheduler_leaves_nothing_and_the_same_command_completes_it(tmp_path, scoped_env,
                                                                                                   signum):
    """A batch scheduler's stop (SIGTERM) or SIGKILL of `--parallel 2`: both runs' processes
    gone within 8 s, and their Ray's session folder (the job's cluster's, on CPUs); after
    SIGKILL the same command completes the sweep, each round once."""
    rounds = 40  # rounds of ~0.1 s: both runs are mid-way when the signal comes
    # One client a round: each run's one client process (its start is a run's largest cost
    # after Flower's own).
    small = SMALL.replace("num-rounds = 2", f"num-rounds = {rounds}\ncheckpoint-every = 2").replace(
        "participation = 0.5", "participation = 0.25")
    path = write_sweep(tmp_path, small.replace("local-epochs = 1", "local-epochs = 4\nbatch-size = 4") + """
[grid]
averaging = ["none", {averaging = "ima", window = 2, avg-start = 2}]
""")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "experiments.sweep", str(path), "--out", str(out), "--no-progress", "--parallel", "2"]
    env, scope = scoped_env
    sessions = ray_sessions()
    sweep = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    runs = [out / "runs" / run.run_id for run in load_sweep(path).runs]
    try:
        deadline = time.monotonic() + 240
        while not all((run / CHECKPOINT_FILE).is_file() for run in runs):
            assert time.monotonic() < deadline and sweep.poll() is None, "the runs never reached their first checkpoint"
            time.sleep(0.05)
        sweep.send_signal(signum)
        signalled = time.monotonic()
        _, err = sweep.communicate(timeout=60)
        while processes_in_scope(scope) and time.monotonic() - signalled < 8:
            time.sleep(0.1)
        assert processes_in_scope(scope) == set(), f"left {time.monotonic() - signalled:.1f} s after the signal"
        assert ray_sessions() == sessions
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    assert sweep.returncode == (130 if signum == signal.SIGTERM else -signal.SIGKILL), err[-2000:]
    for run in runs:
        assert json.loads((run / "summary.json").read_text())["status"] in ("interrupted", "killed")
    if signum == signal.SIGTERM:
        return  # resuming after either is the same: the harsher one is resumed below

    resumed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:] + flower_logs_of_unfinished(runs)
    table = pd.read_parquet(out / "results.parquet")
    assert table["status"].eq("completed").all() and table["rounds"].eq(rounds).all()
    for run in runs:
        assert pd.read_csv(run / "results.csv")["round"].tolist() == list(range(1, rounds + 1))
    assert processes_in_scope(scope) == set()
