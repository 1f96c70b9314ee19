"""A job's own Ray cluster (experiments/runtime/ray_cluster.py's LocalRayCluster): several
runs one after another (and a sweep's runs at once on CPUs) share it and its client
processes, with the bits of runs alone; one that cannot start says why, stops its runs and
leaves nothing behind."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from experiments import run, sweep
from experiments.runtime import launch as launch_module
from experiments.runtime import sweep_runs
from experiments.runtime.launch import launch
from experiments.runtime.ray_cluster import LocalRayCluster, RayClusterUnreachable, check_ray_address, job_cluster
from experiments.runtime.reproducible import compare_runs
from experiments.runtime.run_config import resolve_config
from experiments.runtime.run_endings import RunFailed
from experiments.runtime.sweep_definition import load_sweep

SMALL = {"num-clients": 4, "participation": 0.5, "num-rounds": 2, "local-epochs": 1, "device": "cpu"}


@pytest.mark.slow
def test_a_job_of_runs_one_after_another_shares_one_ray_cluster(tmp_path, monkeypatch):
    """experiments.run with several runs and a sweep, one run after another or (on CPUs)
    with --parallel, start one Ray cluster for all their runs (fake launches here; the real
    one below); a single run and --ray-address do not."""
    addresses = []

    def fake_launch(config, out_dir, *args, ray_address=None, **kwargs):
        addresses.append(ray_address)
        if ray_address:  # the job's own cluster, waited for as a launch waits; it answers while the job runs
            job_cluster(ray_address).wait_until_up()
            check_ray_address(ray_address)
        out_dir.mkdir(parents=True, exist_ok=True)
        raise RunFailed("not run")

    monkeypatch.setattr(launch_module, "launch", fake_launch)
    monkeypatch.setattr(sweep_runs, "launch", fake_launch)
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    two_seeds = tmp_path / "two.toml"
    two_seeds.write_text("[set]\nnum-rounds = 1\n[grid]\nseed = [0, 1]\n")
    assert run.main(["--set", "num-rounds=1", "--compare", "seed=0,1", "--out", str(tmp_path / "r2")]) == 1
    assert sweep.main([str(two_seeds), "--out", str(tmp_path / "s2"), "--no-progress"]) == 1
    shared = addresses[:]
    assert len(shared) == 4 and shared[0] == shared[1] and shared[2] == shared[3] and None not in shared
    with pytest.raises(RayClusterUnreachable):  # stopped with the job
        check_ray_address(shared[0], timeout=1.0)
    addresses.clear()
    assert run.main(["--set", "num-rounds=1", "--out", str(tmp_path / "r1")]) == 1
    assert sweep.main([str(two_seeds), "--out", str(tmp_path / "s3"), "--no-progress", "--parallel", "2"]) == 1
    assert addresses[0] is None and addresses[1] == addresses[2] and addresses[1] not in (None, *shared)


@pytest.mark.parametrize("extra, parallel, shared", [
    ("seed = [0, 1]\n", 1, True),
    ("seed = [0, 1]\n", 2, True),  # at once on CPUs: one cluster, its client processes shared
    ("seed = [0, 1]\n[resources]\nnum-gpus = 0.5\n", 2, False),  # at once on a GPU: a Ray each
    ("seed = [0, 1]\n[resources]\nnum-gpus = 0.5\n", 1, True),
    ("cuda-deterministic = [true, false]\n", 2, False),  # they would end each other's client processes
], ids=["one-after-another", "at-once", "at-once-on-a-gpu", "one-after-another-on-a-gpu",
        "at-once-differing-in-cuda-deterministic"])
def test_a_sweeps_runs_share_one_ray_cluster_one_after_another_and_at_once_on_cpus(tmp_path, monkeypatch, extra,
                                                                                    parallel, shared):
    started = []
    monkeypatch.setattr(sweep_runs.LocalRayCluster, "__enter__", lambda self: started.append(self.enabled) or None)
    monkeypatch.setattr(sweep_runs.LocalRayCluster, "__exit__", lambda self, *exc: None)
    monkeypatch.setattr(sweep_runs, "check_machine", lambda *args: None)  # no GPU here
    monkeypatch.setattr(sweep_runs, "run_sweep", lambda *args: pd.DataFrame({"status": ["completed"]}))
    spec = tmp_path / "sweep.toml"
    spec.write_text("[set]\nnum-rounds = 1\n[grid]\n" + extra)
    sweep_runs.execute_sweep(load_sweep(spec), tmp_path / "out", parallel=parallel)
    assert started == [shared]


def _kept_client_processes() -> set[int]:
    """PIDs of the client processes a job's cluster keeps between runs (clients/client_actor.py)."""
    from experiments.runtime.processes import process_table

    return {pid for pid, (_, _, command) in process_table().items() if command.startswith("ray::KeptClientAppActor")}


@pytest.mark.slow
def test_a_jobs_cluster_is_named_before_it_is_up_its_runs_keep_their_client_processes_and_give_the_bits_of_a_run_alone(
        tmp_path):
    """The job's cluster enters as its address before Ray is up; a launch on it starts
    `flwr run` and then waits for it, and the run joins it (a head without the dashboard's
    API server). On the job's cluster the second run's clients run in the first run's
    processes (no new process imports torch in its round 1). A second run with another
    partition (alpha) and method (MOON) has them import what only it needs and read their
    own sources (the partition cache's key), from the first run's app, and its SuperLink and
    SuperExec forked from the job's warm process: the first run's app folder stays
    until the job ends (it was removed with its run once, and a sweep's second run failed
    in CI), while the second run's, which started no process, goes with its run. It gives
    the bits of the same run alone, launched with its own Ray. A run with another
    process-wide setting gets processes of its own; all end with the job's cluster, and
    the job's folder goes with them."""
    second = {**SMALL, "strategy": "moon", "alpha": 0.7}
    cluster = LocalRayCluster(True, 2)
    with cluster as address:
        assert address.startswith("127.0.0.1:") and job_cluster(address) is cluster and not cluster.up
        summary = launch(resolve_config(SMALL), tmp_path / "fedavg", progress=False, ray_address=address)
        assert cluster.up and summary["status"] == "completed"
        # Its `flwr`, SuperLink and SuperExec were forked from the job's fork server, as the
        # simulation was (warm_processes.start_warm_commands), the job's first run's too.
        assert summary["warm-commands"] == ["flwr", "flower-superlink", "flower-superexec"]
        check_ray_address(address)
        # Its head runs without the dashboard's API server and the autoscaler's monitor
        # (clients/flower_internals.init_ray).
        ray_processes = _ray_processes_of(address)
        assert any("raylet/raylet" in command for command in ray_processes)
        assert not any(part in command for command in ray_processes
                       for part in ("dashboard/dashboard.py", "autoscaler/_private/monitor.py"))
        first = _kept_client_processes()
        assert len(first) == 2  # one per core, alive after their run
        moon = launch(resolve_config(second), tmp_path / "moon", progress=False, ray_address=address)
        assert moon["client-failures"] == 0 and _kept_client_processes() == first
        assert moon["warm-commands"] == ["flwr", "flower-superlink", "flower-superexec"]
        # Its forked `flwr run` found the SuperLink it started first, on the run's own port, and
        # started none on Flower's default port (read from the fork server's environment).
        assert (tmp_path / "moon" / "flwr.log").read_text().count("Starting local SuperLink on") == 1
        assert "training round 1" in moon["startup-stages"]
        launch(resolve_config({**SMALL, "cuda-deterministic": False}), tmp_path / "other", progress=False,
               ray_address=address)
        others = _kept_client_processes()
        assert len(others) == 2 and not others & first
        # The runs that started kept processes keep their FLWR_HOME (and app) until the job ends,
        # as the fork server of its warm simulation processes keeps its app (simulation_forks.py).
        assert sorted(path.name for path in cluster.folder.iterdir()) == ["run-1", "run-3", "simulation-app"]
    assert job_cluster(address) is None and not _kept_client_processes() and not cluster.folder.exists()
    with pytest.raises(RayClusterUnreachable):  # stopped with the job
        check_ray_address(address, timeout=1.0)
    alone = launch(resolve_config(second), tmp_path / "alone", progress=False)
    # Its simulation and commands ran in processes forked from the run's own fork server.
    assert alone["warm-simulation-process"] is True
    assert alone["warm-commands"] == ["flwr", "flower-superlink", "flower-superexec"]
    # Every column of results.csv but the timings, and every tensor of the final model.
    comparison = compare_runs(tmp_path / "moon", tmp_path / "alone")
    assert comparison.identical and comparison.tensors > 0, comparison.report(tmp_path / "moon", tmp_path / "alone")


# In the cluster's holder (it inherits PYTHONPATH): what a library imported there may do.
HOLDER_FAULTS = """
import os, sys
fault = os.environ.get("BASIN_TEST_HOLDER_FAULT")
if fault == "fail":
    sys.stderr.write("boom: no Ray here today\\n")
    sys.stderr.flush()
    os._exit(7)
if fault == "stray":
    print("a library's banner on stdout, before the address", flush=True)
"""


def _holder_faults(tmp_path: Path, monkeypatch, fault: str) -> None:
    (tmp_path / "faults").mkdir()
    (tmp_path / "faults" / "sitecustomize.py").write_text(HOLDER_FAULTS)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "faults"))
    monkeypatch.setenv("BASIN_TEST_HOLDER_FAULT", fault)


def test_a_job_cluster_that_cannot_start_says_why_and_keeps_the_reason_in_the_jobs_log(tmp_path, monkeypatch):
    """The holder's errors went to /dev/null: the error said only that Ray did not start."""
    _holder_faults(tmp_path, monkeypatch, "fail")
    log = tmp_path / "job" / "ray-cluster.log"
    log.parent.mkdir()
    with LocalRayCluster(True, 1, log_path=log) as address:
        cluster = job_cluster(address)
        with pytest.raises(RayClusterUnreachable, match="boom: no Ray here today"):
            cluster.wait_until_up()
        assert "boom: no Ray here today" in log.read_text() and cluster.holder is None
    assert not cluster.folder.exists()


@pytest.mark.slow
def test_a_stray_line_on_the_holders_stdout_does_not_fail_the_start(tmp_path, monkeypatch):
    """The address used to be the holder's first line on stdout: any other line first was a failed start."""
    _holder_faults(tmp_path, monkeypatch, "stray")
    with LocalRayCluster(True, 1) as address:
        cluster = job_cluster(address)
        cluster.wait_until_up()
        check_ray_address(address)
        assert "a library's banner" in Path(cluster.log_path).read_text()  # kept in the cluster's log


def test_a_job_cluster_that_does_not_start_in_time_is_refused_and_its_holder_stopped():
    with LocalRayCluster(True, 1, timeout=0.01) as address:  # at once: the cluster starts beside the job's first run
        cluster = job_cluster(address)
        with pytest.raises(RayClusterUnreachable, match="did not start within"):
            cluster.wait_until_up()
        assert cluster.holder is None and job_cluster(address) is None
    assert not cluster.folder.exists()


def test_a_cluster_that_cannot_start_keeps_its_runs_homes_until_the_job_ends_and_then_leaves_nothing():
    """Its failed start removed the job's folder at once, beneath the run that found it:
    the run's processes, still stopping, wrote into their home meanwhile, and the folder
    was left behind (CI, 2026-11-28: an empty /tmp/basin-ray-job-* after this file's real
    run on a cluster that cannot start)."""
    with LocalRayCluster(True, 1) as address:
        cluster = job_cluster(address)
        cluster.holder.kill()  # Ray never comes up
        with cluster.job_flwr_home() as home:
            with pytest.raises(RayClusterUnreachable, match="did not start"):
                cluster.wait_until_up()
            (Path(home) / "written-by-a-process-still-stopping").write_text("")
    assert not cluster.folder.exists()


def test_a_holder_that_cannot_be_started_leaves_no_folder(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("no process today")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    cluster = LocalRayCluster(True, 1)
    with pytest.raises(OSError, match="no process today"):
        cluster.__enter__()
    assert cluster.folder is not None and not cluster.folder.exists() and not Path(cluster.log_path).exists()


@pytest.mark.slow
def test_a_run_on_a_job_cluster_that_cannot_start_is_stopped_with_a_clear_error_and_leaves_nothing(tmp_path):
    """The job's cluster starts beside its first run: where it dies instead, the launch
    that already started `flwr run` raises RayClusterUnreachable and stops every process of
    the run."""
    from experiments.runtime.processes import flwr_homes

    homes_before = set(flwr_homes().values())
    with LocalRayCluster(True, 1) as address:
        cluster = job_cluster(address)
        cluster.holder.kill()  # Ray never comes up
        with pytest.raises(RayClusterUnreachable, match="did not start"):
            launch(resolve_config(SMALL), tmp_path / "out", progress=False, ray_address=address)
    assert (tmp_path / "out" / "flwr.log").exists()  # Flower had started
    assert set(flwr_homes().values()) <= homes_before  # and nothing of the run is left
    assert not cluster.folder.exists()


def _ray_processes_of(address: str) -> list[str]:
    """The command lines of the processes of the Ray cluster whose GCS listens at ``address``'s port."""
    port = address.rpartition(":")[2]
    commands = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(part.startswith("--gcs-address=") and part.endswith(f":{port}") for part in command.split()):
            commands.append(command)
    return commands
