"""Basin on an existing Ray cluster: the address is checked first, and clients run on every node."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from experiments import run, sweep
from experiments.runtime import launch as launch_module
from experiments.runtime import sweep_runs
from experiments.runtime.launch import launch
from experiments.runtime.processes import free_port, stop_process_tree
from experiments.runtime.ray_cluster import LocalRayCluster, RayClusterUnreachable, check_ray_address, job_cluster
from experiments.runtime.reproducible import compare_runs
from experiments.runtime.run_config import resolve_config
from experiments.runtime.run_endings import RunFailed

RAY = Path(sys.executable).parent / "ray"
SMALL = {"num-clients": 4, "participation": 0.5, "num-rounds": 2, "local-epochs": 1, "device": "cpu"}


def _nobody_listens() -> str:
    return f"127.0.0.1:{free_port()}"


@pytest.fixture
def tiny_sweep(tmp_path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text("[set]\nnum-rounds = 1\n[grid]\nseed = [0]\n")
    return path


@pytest.mark.parametrize("address", ["localhost", "ray://127.0.0.1:10001", "127.0.0.1:port", ":6379"])
def test_a_malformed_address_is_refused(address):
    with pytest.raises(RayClusterUnreachable, match="allowed: the GCS address HOST:PORT"):
        check_ray_address(address)


def test_no_cluster_at_the_address_fails_before_flower_starts(tmp_path):
    address = _nobody_listens()
    started = time.monotonic()
    with pytest.raises(RayClusterUnreachable, match=f"no Ray cluster answers at {address}"):
        launch(resolve_config(SMALL), tmp_path / "out", progress=False, ray_address=address)
    assert time.monotonic() - started < 30  # Flower and Ray's join would take over a minute to fail
    assert not (tmp_path / "out").exists()  # nothing written, Flower never started


def test_the_command_lines_refuse_an_unreachable_cluster(tmp_path, tiny_sweep, capsys):
    address = _nobody_listens()
    assert run.main(["--set", "num-rounds=1", "--out", str(tmp_path / "run"), "--ray-address", address]) == 2
    assert sweep.main([str(tiny_sweep), "--out", str(tmp_path / "sweep"), "--ray-address", address]) == 2
    assert capsys.readouterr().err.count(f"error: no Ray cluster answers at {address}") == 2
    assert {path.name for path in tmp_path.iterdir()} == {tiny_sweep.name}  # no run started


def test_the_command_lines_pass_the_address_to_every_run(tmp_path, tiny_sweep, monkeypatch):
    addresses = []

    def fake_launch(config, out_dir, *args, ray_address=None, **kwargs):
        addresses.append(ray_address)
        out_dir.mkdir(parents=True, exist_ok=True)  # as launch does (run.main has made the job's folder)
        raise RunFailed("not run")

    monkeypatch.setattr(launch_module, "launch", fake_launch)  # run.main imports it when called
    monkeypatch.setattr(sweep_runs, "launch", fake_launch)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # the commands' SIGTERM handler
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        assert run.main(["--set", "num-rounds=1", "--out", str(tmp_path / "run"), "--ray-address", address]) == 1
        assert sweep.main([str(tiny_sweep), "--out", str(tmp_path / "sweep"), "--no-progress",
                           "--ray-address", address]) == 1
    assert addresses == [address, address]


def _start_node(name: str, temp_dir: Path, options: list[str], nodes: list[subprocess.Popen]) -> None:
    """``ray start --block`` in its own process group (appended to ``nodes`` at once, so it
    is stopped even if it never comes up); returns when the node is up."""
    log_path = temp_dir / f"{name}.log"
    with open(log_path, "w") as log:
        node = subprocess.Popen(
            [str(RAY), "start", "--block", "--num-cpus", "1", "--num-gpus", "0", "--temp-dir", str(temp_dir),
             "--object-store-memory", str(100 * 2**20), "--dashboard-agent-listen-port", str(free_port()),
             "--disable-usage-stats", *options],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
        )
    nodes.append(node)
    deadline = time.monotonic() + 60
    while "Ray runtime started." not in log_path.read_text():
        if node.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"Ray node {name} did not start:\n{log_path.read_text()}")
        time.sleep(0.2)


@pytest.fixture
def ray_cluster():
    """A two-node Ray cluster on this machine (1 CPU each), its address; stopped afterwards.

    Private ports, and a private ``--temp-dir`` on both nodes: every ``ray start`` records
    its cluster in ``<temp dir>/ray_current_cluster``, and an address-less ``ray.init()``
    (every other Flower simulation on this machine) joins the cluster recorded in
    ``/tmp/ray``. The temp dir is short: Ray's socket paths must fit in 107 bytes.
    """
    temp_dir = Path(tempfile.mkdtemp(prefix="basin-ray-", dir="/tmp"))
    port = free_port()
    nodes: list[subprocess.Popen] = []
    try:
        _start_node("head", temp_dir, ["--head", "--port", str(port), "--include-dashboard", "false",
                                       "--dashboard-port", str(free_port()),
                                       "--ray-client-server-port", str(free_port())], nodes)
        _start_node("worker", temp_dir, ["--address", f"127.0.0.1:{port}"], nodes)
        yield f"127.0.0.1:{port}"
    finally:
        stop_process_tree([node.pid for node in nodes])
        for node in nodes:
            node.wait(timeout=10)
        deadline = time.monotonic() + 10  # killed daemons are reaped by init
        while (left := [node.pid for node in nodes if _group_alive(node.pid)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, f"processes of Ray process groups {left} survived"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


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


def _cluster_state(address: str) -> tuple[set[str], list[dict]]:
    """The cluster's alive node ids and every actor it has seen (dead ones included).

    Read from the GCS by a short-lived driver: ``ray list actors`` needs the dashboard's
    state API, which the minimal ``ray`` package that Flower installs does not serve.
    """
    script = (
        "import json, ray\n"
        f"ray.init(address={address!r}, logging_level='ERROR', log_to_driver=False)\n"
        "nodes = [n['NodeID'] for n in ray.nodes() if n['Alive']]\n"
        "actors = [{'class': a['ActorClassName'], 'state': a['State'], 'node': a['Address']['NodeID']}\n"
        "          for a in ray._private.state.actors().values()]\n"
        "print(json.dumps({'nodes': nodes, 'actors': actors}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    state = json.loads(done.stdout.splitlines()[-1])
    return set(state["nodes"]), state["actors"]


@pytest.mark.slow
def test_clients_run_on_every_node_of_a_ray_cluster(ray_cluster, tmp_path):
    summary = launch(resolve_config(SMALL), tmp_path, progress=False, ray_address=ray_cluster)

    assert summary["status"] == "completed" and summary["rounds"] == 2
    rows = pd.read_csv(tmp_path / "results.csv")
    assert rows["round"].tolist() == [1, 2] and (rows["clients-ok"] == 2).all()
    nodes, actors = _cluster_state(ray_cluster)
    assert len(nodes) == 2
    clients = [actor for actor in actors if actor["class"] == "ClientAppActor"]
    # One client actor per CPU of the cluster, one on each node (the run's actors are
    # dead by now: the launcher stopped the simulation that owned them).
    assert len(clients) == 2 and {actor["node"] for actor in clients} == nodes
    # The same bits as the same config on this machine alone (tests/test_reproducible.py).
    launch(resolve_config(SMALL), tmp_path / "alone", progress=False)
    comparison = compare_runs(tmp_path, tmp_path / "alone")
    assert comparison.identical and comparison.tensors > 0, comparison.report(tmp_path, tmp_path / "alone")


@pytest.mark.slow
def test_a_job_of_runs_one_after_another_shares_one_ray_cluster(tmp_path, tiny_sweep, monkeypatch):
    """experiments.run with several runs and a sweep without --parallel start one Ray
    cluster for all their runs (fake launches here; the real one below); a single run,
    --parallel and --ray-address do not."""
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
    assert addresses == [None, None, None]


@pytest.mark.slow
def test_runs_on_the_jobs_ray_cluster_equal_runs_with_their_own_ray(tmp_path):
    """Bit for bit on CPU: a run of a job sharing one Ray cluster, and the same config
    launched alone (its simulation starting its own Ray)."""
    small = [f"{key}={value}" for key, value in SMALL.items()]
    arguments = [arg for item in small for arg in ("--set", item)]
    assert run.main([*arguments, "--compare", "averaging=none,ima", "--set", "window=2", "--out",
                     str(tmp_path / "job")]) == 0
    alone = resolve_config({**SMALL, "averaging": "none", "window": 2})
    launch(alone, tmp_path / "alone", progress=False)
    columns = ["round", "test-accuracy", "test-loss", "train-loss", "local-steps"]
    shared_rows = pd.read_csv(tmp_path / "job" / "none" / "results.csv")[columns]
    alone_rows = pd.read_csv(tmp_path / "alone" / "results.csv")[columns]
    assert shared_rows.to_csv() == alone_rows.to_csv()
    comparison = compare_runs(tmp_path / "job" / "none", tmp_path / "alone")  # every column, and the final model
    assert comparison.identical and comparison.tensors > 0, comparison.report(tmp_path / "job" / "none", tmp_path / "alone")
    stages = json.loads((tmp_path / "job" / "none" / "summary.json").read_text())["startup-stages"]
    assert "training round 1" in stages


def _kept_client_processes() -> set[int]:
    """PIDs of the client processes a job's cluster keeps between runs (clients/client_actor.py)."""
    from experiments.runtime.processes import process_table

    return {pid for pid, (_, _, command) in process_table().items() if command.startswith("ray::KeptClientAppActor")}


@pytest.mark.slow
def test_a_jobs_runs_keep_their_client_processes_whose_sources_stay_until_the_job_ends(tmp_path):
    """On the job's cluster the second run's clients run in the first run's processes (no
    new process imports torch in its round 1). A second run with another partition (alpha)
    and method (MOON) has them import what only it needs and read their own sources (the
    partition cache's key), from the first run's app: its folder stays until the job ends
    (it was removed with its run once, and a sweep's second run failed in CI), while the
    second run's, which started no process, goes with its run. They give the bits of
    the same run alone. A run with another process-wide setting gets processes of its own;
    all end with the job's cluster, and the job's folder goes with them."""
    second = {**SMALL, "strategy": "moon", "alpha": 0.7}
    cluster = LocalRayCluster(True, 2)
    with cluster as address:
        launch(resolve_config(SMALL), tmp_path / "fedavg", progress=False, ray_address=address)
        first = _kept_client_processes()
        assert len(first) == 2  # one per core, alive after their run
        moon = launch(resolve_config(second), tmp_path / "moon", progress=False, ray_address=address)
        assert moon["client-failures"] == 0 and _kept_client_processes() == first
        launch(resolve_config({**SMALL, "cuda-deterministic": False}), tmp_path / "other", progress=False,
               ray_address=address)
        others = _kept_client_processes()
        assert len(others) == 2 and not others & first
        # The runs that started kept processes keep their FLWR_HOME (and app) until the job ends.
        assert sorted(path.name for path in cluster.folder.iterdir()) == ["run-1", "run-3"]
    assert not _kept_client_processes() and not cluster.folder.exists()
    alone = launch(resolve_config(second), tmp_path / "alone", progress=False)
    # Its simulation ran in the warm process the launcher started (clients/warm_simulation.py).
    assert alone["warm-simulation-process"] is True
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
def test_a_job_cluster_is_named_before_it_is_up_and_a_run_launched_on_it_meanwhile_completes(tmp_path):
    """The job's cluster enters as its address before Ray is up; a launch on it starts
    `flwr run` and then waits for it, and the run joins it."""
    with LocalRayCluster(True, 2) as address:
        cluster = job_cluster(address)
        assert address.startswith("127.0.0.1:") and not cluster.up
        summary = launch(resolve_config(SMALL), tmp_path / "out", progress=False, ray_address=address)
        assert cluster.up and summary["status"] == "completed"
        check_ray_address(address)
        # Its head runs without the dashboard's API server (clients/flower_internals.init_ray).
        ray_processes = _ray_processes_of(address)
        assert any("raylet/raylet" in command for command in ray_processes)
        assert not any("dashboard/dashboard.py" in command for command in ray_processes)
    assert job_cluster(address) is None
    with pytest.raises(RayClusterUnreachable):  # stopped with the job
        check_ray_address(address, timeout=1.0)


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


def test_the_flower_environment_inlines_models_in_ray_calls_and_keeps_the_users_choice(monkeypatch, tmp_path):
    """Ray's default sends arguments over 100 KiB through its object store: every round's
    model and every reply of the Fashion-MNIST CNN (1.1 MB) did."""
    monkeypatch.delenv(launch_module.INLINE_LIMIT_VARIABLE, raising=False)
    env = launch_module.flower_environment(tmp_path, "home", 1, 2, ray_address=None)
    assert int(env["RAY_max_direct_call_object_size"]) == 8 * 2**20 and "RAY_ADDRESS" not in env
    monkeypatch.setenv(launch_module.INLINE_LIMIT_VARIABLE, "1000")
    env = launch_module.flower_environment(tmp_path, "home", 1, 2, ray_address="10.0.0.5:6379")
    assert env["RAY_max_direct_call_object_size"] == "1000" and env["RAY_ADDRESS"] == "10.0.0.5:6379"
    assert env["PATH"].startswith(str(tmp_path)) and env["FLWR_HOME"] == "home"
