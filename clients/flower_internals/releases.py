"""The Flower and Ray releases whose private sources Basin read, the hash of each function it
replaces or relies on, and whether each speed-up may run here (the package's docstring)."""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import os
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from clients.log import log

# The Flower releases whose sources of every function below were read and hashed: the
# hashes are the same in both. On any other, or with BASIN_SPEEDUPS=off, every speed-up is
# off and Flower's (and Ray's) own code runs: decided from the installed release's metadata,
# before anything private is imported (speed_ups_off_because).
FLOWER_RELEASES = ("1.41.0", "1.42.0")
SPEED_UPS_SWITCH = "BASIN_SPEEDUPS"
ENGINE_MODULE = "flwr.server.superlink.fleet.vce.vce_api"
RUN_INFO_STORE_MODULE = "flwr.compat.client.run_info_store"
LINK_STATE_MODULE = "flwr.server.superlink.linkstate.in_memory_linkstate"
RAY_BACKEND_MODULE = "flwr.server.superlink.fleet.vce.backend.raybackend"
RAY_ACTOR_MODULE = "flwr.simulation.ray_transport.ray_actor"
LOCAL_SUPERLINK_MODULE = "flwr.cli.local_superlink"
RAY_VERSION = "2.55.1"  # the release flwr 1.41.0 and 1.42.0 pin
RAY_NODE_MODULE = "ray._private.node"
SUPERNODE_MODULE = "flwr.supernode.start_client_internal"
HTTP_GRID_MODULE = "flwr.superlink.grid.http_grid"

# SHA-256 of ``inspect.getsource`` of each private function Basin replaces or relies on,
# in flwr 1.41.0 and 1.42.0 (the same), by "module:qualified name".
SOURCE_SHA256 = {
    f"{ENGINE_MODULE}:add_messages_to_queue": "953f4bd41a931a7779a4a670ab17b633f6e20b08a0128535328674466419777a",
    f"{ENGINE_MODULE}:_register_node_info_stores": "09f302a270d22f1e1be21483f4e4475824a0e7c66ee93c58d6b696d57b5f2881",
    f"{ENGINE_MODULE}:_register_nodes": "88a1cb6749e876ed204b9b250b6846dae53e8a20a5df1f79cff060eacab9b998",
    f"{LINK_STATE_MODULE}:InMemoryLinkState.create_node":
        "24e0d726af4322cf2aa14cee2a710bfd0e4a23a4ba7602b962511edbb01a1f76",
    f"{LINK_STATE_MODULE}:InMemoryLinkState.acknowledge_node_heartbeat":
        "87661fe60e1802635940416a25d335c0cf4725f259f4be523fe0c1952793897f",
    f"{RUN_INFO_STORE_MODULE}:DeprecatedRunInfoStore.register_context":
        "e506bc9eefe80c326bafa1a64681a612ef77f901d7ea7ff7bebcbb898b2abe4f",
    f"{LINK_STATE_MODULE}:InMemoryLinkState.store_message_ins":
        "a2b78afac51dc4a23d236ccf8d02958c8d0532aac179cd9ad9b1a0d939eecbea",
    f"{LINK_STATE_MODULE}:InMemoryLinkState.store_message_res":
        "52a4f7ccc70e890843671cc17e603239f50b88de2a0c5d30810a19021c9d594d",
    f"{LINK_STATE_MODULE}:InMemoryLinkState.get_message_ins":
        "6547c8dcbc62e12f5b2aa5c69f4de8c7c7072c10d6c0876512cf37197d941056",
    f"{RAY_BACKEND_MODULE}:RayBackend.init_ray": "617470e8182cea2e3939034f68cf1122e5f9f7283d97cbcf1bd1d0396fa9e67f",
    f"{RAY_BACKEND_MODULE}:RayBackend.build": "6a0c387457a6dbc1b35091762c24afdd2c3453fe09eeceeb7e966136f832ddc0",
    f"{RAY_ACTOR_MODULE}:VirtualClientEngineActor": "a64283908b1ec170b239fcec28ab04e742f54e322802f93ef5d65d5e6d8b6ca0",
    "flwr.serverapp.strategy.fedavg:FedAvg.aggregate_train":
        "0e014b5d7cc3164dbb9b2e453624a02a89673690b62bb091255d9998a632cc57",
    "flwr.serverapp.strategy.fedavg:FedAvg._check_and_log_replies":
        "8eacfa6be09cc25540e8cf2c8b5c6443c044f13f1bfd33607d6ef072c1ce7a35",
    f"{LOCAL_SUPERLINK_MODULE}:ensure_local_superlink": "76aa956feadb39a1c76ba21ae1cd811fdf154936f5a73764b760f9363d122f0f",
    f"{LOCAL_SUPERLINK_MODULE}:_start_local_superlink": "062563a373880275744ea4d479b61c6de0380deeb7bff348812973135f52c349",
    f"{LOCAL_SUPERLINK_MODULE}:_get_local_superlink_paths":
        "14531e883e46e80bc7e1c41aed42dd426b15ac9744432bcb07a6b899d701bda2",
    f"{RAY_NODE_MODULE}:Node.start_head_processes": "c8877a0a14ceb041604d45b880740d5b77f19944b4effa206950d00c1e6236f9",
    f"{RAY_NODE_MODULE}:Node.start_api_server": "5b26a5c3f88fd286d0b3b04e1f937d5d33bdb7c2cf617b7d5b9be866aac62c0f",
    f"{RAY_NODE_MODULE}:Node.start_monitor": "c2a5a730735d410c42df3ea1499c231c37a1a8232f6046ed2465f848880715f0",
    f"{SUPERNODE_MODULE}:start_client_internal": "9e89a6eb68fbec6821e817cd2c09f7894fc7b0f5725c2365b19a7122307f11f3",
    f"{SUPERNODE_MODULE}:_push_messages": "00bb86faffdec114db87e7f716af2acd901d12284e44f51f5c2a84704db05f64",
    f"{HTTP_GRID_MODULE}:HttpGrid.pull_messages": "67a5266a5a2ed51557437a15ef4c8844f46576bc5bb6b0753d2a2f6230a3aa83",
}
# The functions each speed-up relies on.
SPEED_UPS = {
    "engine": [name for name in SOURCE_SHA256
               if not name.startswith(("flwr.serverapp", LOCAL_SUPERLINK_MODULE, "ray.", SUPERNODE_MODULE,
                                       HTTP_GRID_MODULE))],
    "in-place mean": [name for name in SOURCE_SHA256 if name.startswith("flwr.serverapp")],
    "local SuperLink": [name for name in SOURCE_SHA256 if name.startswith(LOCAL_SUPERLINK_MODULE)],
    "Ray head": [name for name in SOURCE_SHA256 if name.startswith("ray.")],
    "SuperNode polling": [name for name in SOURCE_SHA256 if name.startswith(SUPERNODE_MODULE)],
}
# Names that are Flower's private surface: used in this module only (identifiers, and
# module prefixes in imports and strings). STRATEGY_STATE_ATTRIBUTES are not among them:
# Basin's FedAvgM and FedOpt subclass Flower's and share those public attribute names.
PRIVATE_NAMES = (
    "vce_api", "add_messages_to_queue", "raybackend", "RayBackend", "message_ins_store",
    "_register_node_info_stores", "DeprecatedRunInfoStore", "RunInfo",
    "run_info_store", "in_memory_linkstate", "_check_and_log_replies", "SType", "TaskIdentity", "flwr.common",
    "flwr.supercore", "flwr.compat", "flwr.server.", "VirtualClientEngineActor", "flwr.simulation.ray_transport",
    "flwr.cli.local_superlink", "ray._private", "start_api_server", "start_monitor", "_add_noise_to_aggregated_arrays",
    "start_client_internal", "flwr.superlink", "HttpGrid",
)


def installed_flower() -> str:
    return installed_release("flwr")


def speed_ups_off_because() -> str:
    """'' where Basin's speed-ups may run; else why every one is off (``BASIN_SPEEDUPS=off``,
    or a Flower release they were not checked against). Reads only the environment and the
    installed release's metadata: nothing of Flower is imported."""
    if os.environ.get(SPEED_UPS_SWITCH, "on") == "off":
        return f"{SPEED_UPS_SWITCH}=off"
    if (installed := installed_flower()) not in FLOWER_RELEASES:
        return f"this is flwr {installed}, not {' or '.join(FLOWER_RELEASES)}"
    return ""


def installed_release(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def resolve(name: str) -> Any:
    """The object ``module:qualified.name`` names (imports the module)."""
    module_name, _, qualified = name.partition(":")
    value: Any = importlib.import_module(module_name)
    for part in qualified.split("."):
        value = getattr(value, part)
    return value


def source_hash(function: Any) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()


# Flower's functions this process replaced, by "module:name" (the originals, for checks and tests).
replaced: dict[str, Any] = {}


def original(name: str) -> Any:
    """Flower's object under ``name``, also after Basin replaced it in this process."""
    return replaced[name] if name in replaced else resolve(name)


def checked_releases(name: str) -> tuple[str, tuple[str, ...], str]:
    """(package, the releases it was checked against, the installed one) of the object ``name``."""
    if name.startswith("ray."):
        return "ray", (RAY_VERSION,), installed_release("ray")
    return "flwr", FLOWER_RELEASES, installed_flower()


def mismatch(name: str) -> str:
    """'' when the object under ``name`` is a checked release's exact source (flwr 1.41.0 or
    1.42.0, or Ray 2.55.1 for ``ray.`` names), else what differs."""
    package, releases, installed = checked_releases(name)
    if installed not in releases:
        return f"this is {package} {installed}, not {' or '.join(releases)}"
    try:
        found = source_hash(original(name))
    except (ImportError, AttributeError, OSError, TypeError) as error:
        return f"{name} is not there ({type(error).__name__}: {error})"
    return "" if found == SOURCE_SHA256[name] else f"{name} differs from {package} {installed}'s as checked"


@functools.cache
def speed_up_available(speed_up: str) -> bool:
    """Whether ``speed_up`` may run: the switch is not off and every function it relies on
    is a checked release's; where a function is not, say so once (Basin then runs
    Flower's, or Ray's, own code for it). The switch turns it off without a word."""
    if os.environ.get(SPEED_UPS_SWITCH, "on") == "off":
        return False
    problems = [problem for name in SPEED_UPS[speed_up] if (problem := mismatch(name))]
    if problems:
        package, releases, _ = checked_releases(SPEED_UPS[speed_up][0])
        owner = "Ray" if package == "ray" else "Flower"
        log.warning(f"{speed_up} speed-up off, {owner}'s own code runs instead: {problems[0]} "
                    f"(clients/flower_internals/ was checked against {package} {', '.join(releases)})")
    return not problems
