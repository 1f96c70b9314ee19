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
from experiments.runtime.ray_cluster import RayClusterUnreachable, check_ray_address
from experiments.runtime.reproducible import compare_runs
from experiments.runtime.run_config import resolve_config
from experiments.runtime.run_endings import RunFailed

RAY = Path(sys.executable).parent / "ray"
SMALL = {"num-clients": 4, "participation": 0.5, "num-rounds": 2, "local-epochs": 1, "device": "cpu"}
# The same config on this machine, with the session's other reference runs (tests/conftest.py).
FLOWER_RUNS = {"ray-cluster-reference": SMALL}


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
@pytest.mark.flower_runs("ray-cluster-reference")
def test_clients_run_on_every_node_of_a_ray_cluster(flower_runs, ray_cluster, tmp_path):
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
    # The same bits as the same config on this machine (tests/test_reproducible.py).
    reference = flower_runs["ray-cluster-reference"].completed()
    comparison = compare_runs(tmp_path, reference)
    assert comparison.identical and comparison.tensors > 0, comparison.report(tmp_path, reference)


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
