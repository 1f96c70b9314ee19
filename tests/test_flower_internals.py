"""Flower's private surface is used in the package clients/flower_internals/ only, checked against
flwr 1.41.0 and 1.42.0, and failing soft where it is only a speed-up."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from clients import flower_internals

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("strategies", "clients", "partitions", "experiments")
MODULE_PREFIXES = tuple(name for name in flower_internals.PRIVATE_NAMES if "." in name)
IDENTIFIERS = {name for name in flower_internals.PRIVATE_NAMES if "." not in name}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def private_uses(path: Path) -> list[str]:
    """Flower private names a module's code (not its docstrings or comments) uses."""
    tree = ast.parse(path.read_text())
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.alias):
            names = [node.name, node.name.split(".")[-1]]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [f"import from {node.module}" for prefix in MODULE_PREFIXES if node.module.startswith(prefix.rstrip("."))
                      and (node.module + ".").startswith(prefix if prefix.endswith(".") else prefix + ".")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += [f"string {node.value!r}" for prefix in MODULE_PREFIXES if node.value.startswith(prefix)]
        found += [name for name in names if name in IDENTIFIERS]
    return found


def test_private_flower_names_are_used_in_flower_internals_only():
    uses = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "flower_internals" in path.relative_to(REPO).parts:
                continue
            if found := private_uses(path):
                uses[str(path.relative_to(REPO))] = sorted(set(found))
    assert not uses, f"Flower's private surface used outside clients/flower_internals/: {uses}"


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The rule bites: each kind of use is found, a docstring mentioning a name is not."""
    module = tmp_path / "m.py"
    module.write_text('"""Mentions vce_api and _check_and_log_replies in prose."""\n'
                      "from flwr.common.constant import SType\n"
                      "import flwr.server.superlink.linkstate as link\n"
                      "x = strategy._check_and_log_replies(replies)\n"
                      "name = 'flwr.supercore.task_identity'\n")
    found = private_uses(module)
    assert "import from flwr.common.constant" in found and "SType" in found and "_check_and_log_replies" in found
    assert any(use.startswith("string 'flwr.supercore") for use in found)
    assert "vce_api" not in found


def test_every_function_basin_relies_on_is_the_installed_flowers():
    """Fails when Flower is upgraded: re-read each function against the new release and
    add it to FLOWER_RELEASES and update SOURCE_SHA256 (the speed-ups are off until then)."""
    problems = {name: problem for name in flower_internals.SOURCE_SHA256 if (problem := flower_internals.mismatch(name))}
    assert not problems
    assert all(flower_internals.speed_up_available(name) for name in flower_internals.SPEED_UPS)


@pytest.mark.usefixtures("server_identity")
def test_on_another_flower_the_mean_is_flowers_own_and_the_same(monkeypatch, capsys):
    from strategies.weighted_mean import InPlaceFedAvg

    def reply(values, n):
        content = RecordDict({"arrays": ArrayRecord({"w": Array(np.asarray(values, np.float32))}),
                              "metrics": MetricRecord({"num-examples": n})})
        request = Message(content=RecordDict({"config": ConfigRecord()}), dst_node_id=5, message_type=MessageType.TRAIN)
        return Message(content=content, reply_to=request)

    replies = [reply([1.0, 2.0], 1), reply([4.0, 8.0], 3)]
    strategy = InPlaceFedAvg()
    in_place, _ = strategy.aggregate_train(1, replies)
    monkeypatch.setattr(flower_internals.releases, "installed_flower", lambda: "9.9.9")
    flower_internals.speed_up_available.cache_clear()
    try:
        flowers, _ = strategy.aggregate_train(1, replies)
        assert "in-place mean speed-up off, Flower's own code runs instead: this is flwr 9.9.9" in capsys.readouterr().err
        assert [c.content for c in replies] and strategy.checked_contents(replies)  # the replies without an error
    finally:
        flower_internals.speed_up_available.cache_clear()
    assert np.array_equal(in_place["w"].numpy(), flowers["w"].numpy())
    assert in_place["w"].numpy().tolist() == [3.25, 6.5]


def test_the_local_superlink_basin_starts_is_the_one_flwr_run_starts(tmp_path, monkeypatch):
    """experiments/runtime/flwr_command.py starts `flwr run`'s SuperLink ahead of it: the
    same command line and environment Flower's own start gives it, in the same FLWR_HOME."""
    from flwr.cli import local_superlink

    started = {}

    class Started(Exception):
        pass

    def popen(command, env, **kwargs):
        started.update(command=command, env=env)
        raise Started

    environ = {"FLWR_HOME": str(tmp_path / "home"), "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": "41001",
               "FLWR_LOCAL_CONTROL_API_PORT": "41003", "PATH": "/bin"}
    monkeypatch.setattr(local_superlink.os, "environ", environ)
    monkeypatch.setattr(local_superlink, "LOCAL_SUPERLINK_HTTP_API_PORT", "41001")
    monkeypatch.setattr(local_superlink, "LOCAL_CONTROL_API_ADDRESS", "127.0.0.1:41003")
    monkeypatch.setattr(local_superlink.subprocess, "Popen", popen)
    with pytest.raises(Started):
        local_superlink._start_local_superlink(in_memory=True)
    command, env = flower_internals.local_superlink(environ)
    assert command == started["command"] and env == started["env"]
    assert "41001" in command and "127.0.0.1:41003" in command and env["FLWR_DISABLE_UPDATE_CHECK"] == "1"
    assert (tmp_path / "home" / "local-superlink").is_dir()
    assert flower_internals.local_superlink_port(environ) == "41001"
    defaults, _ = flower_internals.local_superlink({"FLWR_HOME": str(tmp_path / "home")})  # Flower's own ports
    assert defaults[defaults.index("--port") + 1] == "39091" and "127.0.0.1:39093" in defaults


def test_a_ray_head_started_without_the_dashboard_starts_no_api_server_nor_monitor_and_ray_keeps_its_own_otherwise(
        monkeypatch):
    """flower_internals.init_ray: Ray 2.55.1's head starts the dashboard's API server, and
    waits for it, even with include_dashboard=False, and the autoscaler's monitor. While
    Basin's ray.init starts a head without the dashboard, Node.start_api_server and
    Node.start_monitor start nothing; any other ray.init (a dashboard asked for, a cluster
    joined) runs Ray's own, and Ray's are back after."""
    import ray
    from ray._private import node

    ray_own = (node.Node.start_api_server, node.Node.start_monitor)
    seen = []
    monkeypatch.setattr(ray, "init", lambda **init_args: seen.append(
        (init_args, (node.Node.start_api_server, node.Node.start_monitor))))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    flower_internals.init_ray(num_cpus=2, include_dashboard=False)
    init_args, (start_api_server, start_monitor) = seen[-1]
    assert init_args == {"num_cpus": 2, "include_dashboard": False}
    assert start_api_server is not ray_own[0] and start_monitor is not ray_own[1]
    started = type("Head", (), {"_webui_url": None, "all_processes": {}})()
    assert start_api_server(started, include_dashboard=False, raise_on_failure=False) is None
    assert started._webui_url == ""  # what include_dashboard=False leaves: no dashboard URL
    assert start_monitor(started) is None and started.all_processes == {}
    assert (node.Node.start_api_server, node.Node.start_monitor) == ray_own

    flower_internals.init_ray(include_dashboard=True)
    flower_internals.init_ray(address="127.0.0.1:6379", include_dashboard=False)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    flower_internals.init_ray(include_dashboard=False)
    assert [start for _, start in seen[1:]] == [ray_own] * 3


def test_a_supernodes_waits_are_capped_and_flowers_own_on_another_flower(monkeypatch):
    """Basin's local federation starts its SuperNodes with their waits for a message (3 s)
    and for a reply (0.5 s) each at most 0.2 s (experiments/runtime/supernode_command.py);
    on a Flower release not checked, Flower's own waits stay."""
    import importlib
    import time

    from experiments.runtime.supernode_command import POLL_SECONDS

    module = importlib.import_module(flower_internals.SUPERNODE_MODULE)
    monkeypatch.setattr(module, "time", time)  # restored after the test
    slept = []
    clock = type("Clock", (), {"sleep": staticmethod(slept.append), "monotonic": staticmethod(lambda: 7.0)})
    monkeypatch.setattr(flower_internals.supernode, "time", clock)
    try:
        with monkeypatch.context() as another:
            another.setattr(flower_internals.releases, "installed_flower", lambda: "9.9.9")
            flower_internals.speed_up_available.cache_clear()
            assert not flower_internals.cap_supernode_waits(POLL_SECONDS)
            assert module.time is time
        flower_internals.speed_up_available.cache_clear()
        assert flower_internals.cap_supernode_waits(POLL_SECONDS)
    finally:
        flower_internals.speed_up_available.cache_clear()
    module.time.sleep(3)  # no message from the SuperLink
    module.time.sleep(0.5)  # no reply from the ClientApp yet
    module.time.sleep(0.1)
    assert slept == [0.2, 0.2, 0.1] and module.time.monotonic() == 7.0  # the rest of `time` is time's
