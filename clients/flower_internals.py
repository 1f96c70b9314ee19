"""Every use Basin makes of Flower's (and Ray's) private surface, in one place, checked
against the releases it was read from (flwr 1.41.0 and 1.42.0; Ray 2.55.1, which both pin).

Basin builds on Flower's public API freely; anything beyond it is named here and nowhere
else (``tests/test_flower_internals.py`` fails on a private name used in another module):

- speed-ups, each with Flower's own code as the fallback: the simulation engine's
  replacements (clients/simulation_engine.py: the engine's hand-out scan, node
  registration and contexts, the link state's stores, ``RayBackend.init_ray`` and the
  client actor the backend builds), the in-place FedAvg mean and its reply checks
  (strategies/weighted_mean.py), the local SuperLink started ahead of ``flwr run``
  (experiments/runtime/flwr_command.py) and Ray's head without the dashboard's API server
  and the autoscaler's monitor (:func:`init_ray`);
- a fix, with Flower's own code as the fallback: a deployment's replies pulled within
  the round's deadline (:func:`pull_replies`);
- required: the attributes in which FedAvgM and FedOpt keep their state
  (:data:`STRATEGY_STATE_ATTRIBUTES`, checkpoints), ``SType.NUMPY`` (array encoding) and
  ``TaskIdentity`` (messages built outside a ServerApp, experiments/costs.py).

:data:`SOURCE_SHA256` holds the hash of each private function's source; :func:`mismatch`
compares the installed release and sources with it. A speed-up whose functions differ is
off, said once (:func:`speed_up_available`); on a release not checked, or with
``BASIN_SPEEDUPS=off``, every one is off, decided before anything private is imported
(:func:`speed_ups_off_because`). Nothing refuses to run. What each speed-up does and saves:
docs/speed.md.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import inspect
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
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
# Attributes in which Flower's strategies keep server state across rounds (FedOpt's
# current model and moments, FedAvgM's momentum).
STRATEGY_STATE_ATTRIBUTES = ("current_arrays", "m_t", "v_t", "momentum_vector")
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


# What `flwr run` calls its local SuperLink's settings: environment variables, then its defaults.
LOCAL_SUPERLINK_HTTP_PORT_VARIABLE, LOCAL_SUPERLINK_HTTP_PORT = "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "39091"
LOCAL_CONTROL_PORT_VARIABLE, LOCAL_CONTROL_PORT = "FLWR_LOCAL_CONTROL_API_PORT", "39093"


def local_superlink(environ: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment with which ``flwr run``, run in ``environ`` (which
    sets FLWR_HOME), starts its local SuperLink when none answers and its connection is
    ``:local-in-memory:``: flwr 1.41.0 and 1.42.0's ``_start_local_superlink(in_memory=True)``
    (simulation mode, subprocess isolation, state in memory, its log under
    ``FLWR_HOME/local-superlink``, the folder made here as there)."""
    runtime_dir = Path(environ["FLWR_HOME"]) / "local-superlink"
    runtime_dir.mkdir(parents=True, exist_ok=True)
    command = [
        "flower-superlink", "--insecure", "--simulation", "--isolation", "subprocess",
        "--control-api-address", f"127.0.0.1:{environ.get(LOCAL_CONTROL_PORT_VARIABLE, LOCAL_CONTROL_PORT)}",
        "--host", "127.0.0.1", "--port", local_superlink_port(environ),
        "--log-file", str(runtime_dir / "superlink.log"),
        "--log-rotation-interval-hours", "24", "--log-rotation-backup-count", "7",
    ]
    # `flwr` checks for a newer Flower itself, and so turns the SuperLink's check off.
    return command, {**environ, "FLWR_DISABLE_UPDATE_CHECK": "1"}


def local_superlink_port(environ: Mapping[str, str]) -> str:
    """The HTTP port on which ``flwr run``, run in ``environ``, looks for its local SuperLink."""
    return environ.get(LOCAL_SUPERLINK_HTTP_PORT_VARIABLE, LOCAL_SUPERLINK_HTTP_PORT)


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
                    f"(clients/flower_internals.py was checked against {package} {', '.join(releases)})")
    return not problems


@functools.cache
def bounded_reply_pulls_available() -> bool:
    """Whether :func:`pull_replies` may run its own pull: ``HttpGrid.pull_messages`` is a
    checked release's; where it is not, say so once (Flower's pull then runs)."""
    if problem := mismatch(f"{HTTP_GRID_MODULE}:HttpGrid.pull_messages"):
        log.warning(f"replies are pulled by Flower's own code, which waits for a reply's arrays until the "
                    f"SuperLink's object-push session expires, past round-timeout: {problem}")
    return not problem


# A reply's arrays that are not there yet are asked for again after this many seconds,
# doubling up to the cap (Flower's: from 1 s up to 10 s): a pull bounded by a round's
# deadline ends within a fraction of a second of it.
REPLY_PULL_BACKOFF_S, REPLY_PULL_BACKOFF_CAP_S = 0.01, 0.2


def pull_replies(grid: Any, message_ids: Iterable[str], deadline: float) -> list:
    """``grid.pull_messages(message_ids)``, where a deployment's grid waits for each reply's
    arrays until ``deadline`` (a ``time.monotonic()`` time) at most.

    Over HTTP (``HttpGrid``), flwr 1.41.0 and 1.42.0's ``pull_messages`` hands a reply out
    once the SuperNode has sent its metadata, then waits for its arrays until they are all
    there or the SuperLink's object-push session expires (180 s): a SuperNode frozen or cut
    off mid-upload held its round ~3 minutes past round-timeout, and the replies that arrived
    meanwhile stayed unpulled. This is that method with each reply's object pulls bounded by
    ``deadline``: a reply whose arrays are not all there by then is left out (its node did not
    reply in time; the SuperLink hands a reply out once). Any other grid, or a release
    whose method differs, runs ``grid.pull_messages``."""
    module = sys.modules.get(HTTP_GRID_MODULE)
    if module is None or not isinstance(grid, module.HttpGrid) or not bounded_reply_pulls_available():
        return list(grid.pull_messages(message_ids))
    import httpx
    from flwr.app import Metadata
    from flwr.app.error import Error
    from flwr.app.message import make_message
    from flwr.common.constant import ErrorCode
    from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest
    from flwr.supercore.constant import SYSTEM_MESSAGE_TYPE
    from flwr.supercore.date import now
    from flwr.supercore.inflatable.inflatable_object import iterate_object_tree
    from flwr.supercore.inflatable.inflatable_protobuf_utils import make_pull_object_fn_protobuf
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError, inflate_object_from_contents, pull_objects

    run_id, client, node = grid._run.run_id, grid._runtime_client, grid.node
    try:
        response = client.PullMessages(PullAppMessagesRequest(message_ids=message_ids))
    except httpx.HTTPStatusError as error:
        if error.response.status_code == httpx.codes.REQUEST_ENTITY_TOO_LARGE:
            log.error(module.ERROR_MESSAGE_PULL_MESSAGES_PAYLOAD_TOO_LARGE)
            return []
        raise
    replies = []
    for reply, tree in zip(response.messages_list, response.message_object_trees, strict=True):
        message_id = reply.metadata.message_id
        try:
            contents = pull_objects(
                [subtree.object_id for subtree in iterate_object_tree(tree)],
                make_pull_object_fn_protobuf(pull_object_protobuf=client.PullObject, node=node, run_id=run_id),
                max_time=max(deadline - time.monotonic(), 0.0),
                initial_backoff=REPLY_PULL_BACKOFF_S, backoff_cap=REPLY_PULL_BACKOFF_CAP_S,
            )
        except ObjectPullError as error:
            if time.monotonic() >= deadline:
                continue
            # Flower's reply for arrays the SuperLink no longer holds.
            replies.append(make_message(
                metadata=Metadata(run_id=run_id, message_id="", src_node_id=node.node_id, dst_node_id=node.node_id,
                                  message_type=SYSTEM_MESSAGE_TYPE, group_id="", ttl=0,
                                  reply_to_message_id=reply.metadata.reply_to_message_id,
                                  created_at=now().timestamp()),
                error=Error(code=ErrorCode.MESSAGE_UNAVAILABLE,
                            reason="Reply message objects are unavailable. The sender may not have completed the "
                                   f"upload before the object-push session expired. {error}"),
            ))
            continue
        client.ConfirmMessageReceived(ConfirmMessageReceivedRequest(node=node, run_id=run_id,
                                                                    message_object_id=message_id))
        message = inflate_object_from_contents(message_id, contents)
        message.metadata.__dict__["_message_id"] = message_id
        replies.append(message)
    return replies


def check_and_log_replies(strategy: Any, replies: Any, is_train: bool) -> tuple[list, list]:
    """Flower's ``FedAvg._check_and_log_replies``: (valid replies, error replies)."""
    return strategy._check_and_log_replies(replies, is_train=is_train)


def clip_model_update(reply_arrays: list, sent_arrays: list, clipping_norm: float) -> bool:
    """Flower's ``compute_clip_model_update``, the clipping its DP wrappers apply: in place,
    ``reply_arrays`` becomes sent + (reply − sent) · C / ‖reply − sent‖₂ where that norm
    exceeds C; True if it did. A reply within the norm is left as it is (Flower's rewrite as
    sent + (reply − sent) can change its last bits), so a norm that never binds gives the
    bits of a run without clipping."""
    import numpy as np
    from flwr.supercore.differential_privacy import compute_clip_model_update, get_norm

    if get_norm([np.subtract(reply, sent) for reply, sent in zip(reply_arrays, sent_arrays, strict=True)]) <= clipping_norm:
        return False
    compute_clip_model_update(reply_arrays, sent_arrays, clipping_norm)
    return True


def error_in_place_of(reply: Any, code: int, reason: str) -> Any:
    """An error reply with ``reply``'s metadata (its sender and the message it answers):
    Flower's public constructor makes error replies only from the instruction message."""
    from flwr.app import Error
    from flwr.app.message import make_message

    return make_message(reply.metadata, error=Error(code, reason))


def add_aggregate_noise(strategy: Any, aggregated: Any) -> Any:
    """Flower's ``DifferentialPrivacyFixedClippingBase._add_noise_to_aggregated_arrays``:
    ``aggregated`` plus N(0, (σ C / m)²) noise from NumPy's global generator."""
    return strategy._add_noise_to_aggregated_arrays(aggregated)


def numpy_stype() -> str:
    """The ``Array.stype`` of an array serialised with ``np.save``."""
    from flwr.common.constant import SType

    return SType.NUMPY


def strategy_state(strategy: Any) -> dict[str, Any]:
    """The values of :data:`STRATEGY_STATE_ATTRIBUTES` that ``strategy`` has."""
    return {name: getattr(strategy, name) for name in STRATEGY_STATE_ATTRIBUTES if hasattr(strategy, name)}


def engine_module() -> Any:
    """Flower's simulation engine module when this process runs it (imported), else None."""
    return sys.modules.get(ENGINE_MODULE)


def load_engine() -> None:
    """Import Flower's simulation engine module (in a process that is about to run it)."""
    importlib.import_module(ENGINE_MODULE)


def engine_function(name: str) -> Any:
    """The function ``name`` of Flower's simulation engine module where this process runs it, else None."""
    return getattr(engine_module(), name, None)


def replace_engine_functions(add_messages_to_queue: Any, register_node_info_stores: Any, register_nodes: Any) -> bool:
    """In a process running Flower's simulation engine, put the given functions in place
    of the engine's functions of the same names (its message hand-out scan, its
    registration of the nodes' contexts, its registration of the nodes in the link
    state); True when they are in place, False where no engine runs or the engine is not
    a checked release's (said once: Flower's run)."""
    engine = engine_module()
    if engine is None:
        return False
    wanted = {"add_messages_to_queue": add_messages_to_queue, "_register_node_info_stores": register_node_info_stores,
              "_register_nodes": register_nodes}
    if all(getattr(engine, name) is function for name, function in wanted.items()):
        return True
    if not speed_up_available("engine"):
        return False
    for name, function in wanted.items():
        if getattr(engine, name) is not function:
            replaced[f"{ENGINE_MODULE}:{name}"] = getattr(engine, name)
            setattr(engine, name, function)
    return True


def replace_ray_init(init_ray: Any) -> bool:
    """In a process running Flower's simulation engine (a checked release's), make ``init_ray`` the
    Ray backend's ``init_ray``; True when it is in place."""
    if engine_module() is None or not speed_up_available("engine"):
        return False
    backend = importlib.import_module(RAY_BACKEND_MODULE).RayBackend
    if backend.init_ray is not init_ray:
        replaced.setdefault(f"{RAY_BACKEND_MODULE}:RayBackend.init_ray", backend.init_ray)
        backend.init_ray = init_ray
    return True


def replace_client_actor(actor_class: Any) -> bool:
    """In a process running Flower's simulation engine (a checked release's), make ``actor_class`` the
    actor that the Ray backend builds its pool of (``RayBackend.build`` reads the
    module's ``ClientAppActor``); True when it is in place."""
    if engine_module() is None or not speed_up_available("engine"):
        return False
    backend = importlib.import_module(RAY_BACKEND_MODULE)
    if backend.ClientAppActor is not actor_class:
        replaced.setdefault(f"{RAY_BACKEND_MODULE}:ClientAppActor", backend.ClientAppActor)
        backend.ClientAppActor = actor_class
    return True


class _CappedSleeps:
    """The ``time`` module as Flower's SuperNode loop sees it, each ``sleep`` at most ``seconds``."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self.seconds))


def cap_supernode_waits(seconds: float) -> bool:
    """In a process about to run Flower's ``flower-supernode``: make each of the SuperNode's
    waits at most ``seconds``; True where the speed-up is in place. flwr 1.41.0 and 1.42.0's
    ``start_client_internal`` sleeps 3 s whenever it asked the SuperLink for a message and
    none was there, and ``_push_messages`` 0.5 s at a time until the ClientApp's reply is
    there, so each round of a federation on one machine waited seconds for its nodes to
    notice it (their module's only use of ``time``)."""
    if not speed_up_available("SuperNode polling"):
        return False
    module = importlib.import_module(SUPERNODE_MODULE)
    if not isinstance(module.time, _CappedSleeps):
        replaced.setdefault(f"{SUPERNODE_MODULE}:time", module.time)
    module.time = _CappedSleeps(seconds)
    return True


def init_ray(**init_args: Any) -> None:
    """``ray.init(**init_args)``. Where that starts a Ray head here with
    ``include_dashboard=False`` (no address, no ``RAY_ADDRESS``) on Ray 2.55.1, the head
    starts without two of its processes, which nothing Flower or Basin runs reads:
    - the dashboard's API server: ``Node.start_api_server`` leaves the empty dashboard URL
      that ``include_dashboard=False`` gives, and starts and waits for nothing (~1–2 s of
      each Ray start on 2 cores);
    - the autoscaler's monitor (``Node.start_monitor``, what ``ray start --no-monitor``
      leaves out): it would scale a cluster of nodes Ray launches, and a head started here
      is one machine's; ~0.5 CPU-seconds of each Ray start, 0.4 s of a small run's wall
      time on 2 cores."""
    import os

    import ray

    starts_head = "address" not in init_args and not os.environ.get("RAY_ADDRESS")
    if not starts_head or init_args.get("include_dashboard") is not False or not speed_up_available("Ray head"):
        ray.init(**init_args)
        return
    node_class = importlib.import_module(RAY_NODE_MODULE).Node
    for method, replacement in HEAD_WITHOUT.items():
        replaced[f"{RAY_NODE_MODULE}:Node.{method}"] = getattr(node_class, method)
        setattr(node_class, method, replacement)
    try:
        ray.init(**init_args)
    finally:
        for method in HEAD_WITHOUT:
            setattr(node_class, method, replaced.pop(f"{RAY_NODE_MODULE}:Node.{method}"))


def _no_api_server(node: Any, *, include_dashboard: bool | None, raise_on_failure: bool) -> None:
    node._webui_url = ""


def _no_monitor(node: Any) -> None:
    pass


# What init_ray's Ray head starts without: Node's method → what runs instead.
HEAD_WITHOUT = {"start_api_server": _no_api_server, "start_monitor": _no_monitor}


def undelivered_destinations(state: Any) -> set[int]:
    """The nodes that messages in Flower's in-memory link state wait for (stored, not yet
    handed out): what ``get_message_ins`` would find, without asking every node."""
    with state.lock:
        return {message.metadata.dst_node_id for message in state.message_ins_store.values()
                if message.metadata.delivered_at == ""}


def add_online_nodes(state_factory: Any, count: int) -> list[int]:
    """Add ``count`` nodes to the in-memory link state of ``state_factory`` as the engine's
    ``_register_nodes`` leaves each one (``create_node``, then ``acknowledge_node_heartbeat``):
    owned by Flower's no-op account, a random 32-byte public key, online, heartbeats off;
    return their ids, in order.

    The node records are the same, built at once: one reading of the clock for all (Flower
    reads it twice per node, so its timestamps differ by microseconds), the random ids and
    keys from one draw of ``os.urandom`` (Flower's source, one call per node), ids drawn
    again where they collide as ``create_node`` avoids them, under one hold of the lock,
    without the cyclic garbage collector: ~6 s for 10⁶ nodes on an idle core, against ~27 s
    for Flower's loop (and ~7 s with the collector walking the records as they are made).
    """
    import gc
    import os

    engine = importlib.import_module(ENGINE_MODULE)
    link_state = importlib.import_module(LINK_STATE_MODULE)
    id_bytes, key_bytes = link_state.NODE_ID_NUM_BYTES, 32
    state = state_factory.state()
    current = link_state.now()
    timestamp = current.isoformat()
    online_until = current.timestamp() + link_state.HEARTBEAT_PATIENCE * engine.HEARTBEAT_INTERVAL_INF
    owner, owner_name = engine.NOOP_FLWR_AID, engine.NOOP_ACCOUNT_NAME
    ids, keys = os.urandom(id_bytes * count), os.urandom(key_bytes * count)
    node_ids = []
    collecting = gc.isenabled()
    gc.disable()  # the records hold no cycles; collections while 10⁶ are made walk them again and again
    try:
        with state.lock:
            taken = {link_state.SUPERLINK_NODE_ID, 0}
            owned = state.owner_to_node_ids.setdefault(owner, set())
            for index in range(count):
                node_id = int.from_bytes(ids[index * id_bytes:(index + 1) * id_bytes], "little")
                while node_id in taken or node_id in state.nodes:
                    node_id = int.from_bytes(os.urandom(id_bytes), "little")
                public_key = keys[index * key_bytes:(index + 1) * key_bytes]
                while public_key in state.node_public_key_to_node_id:
                    public_key = os.urandom(key_bytes)
                state.nodes[node_id] = link_state.NodeInfo(
                    node_id=node_id, owner_aid=owner, owner_name=owner_name, status=link_state.NodeStatus.ONLINE,
                    registered_at=timestamp, last_activated_at=timestamp, heartbeat_interval=engine.HEARTBEAT_INTERVAL_INF,
                    online_until=online_until, public_key=public_key,
                )
                state.node_public_key_to_node_id[public_key] = node_id
                owned.add(node_id)
                node_ids.append(node_id)
    finally:
        if collecting:
            gc.enable()
    return node_ids


def partition_keys() -> tuple[str, str]:
    """The node-config keys of a simulated node's partition id and partition count."""
    engine = importlib.import_module(ENGINE_MODULE)
    return engine.PARTITION_ID_KEY, engine.NUM_PARTITIONS_KEY


def run_info_store_classes() -> tuple[type, type]:
    """(DeprecatedRunInfoStore, RunInfo): a simulated node's run contexts."""
    module = importlib.import_module(RUN_INFO_STORE_MODULE)
    return module.DeprecatedRunInfoStore, module.RunInfo


@contextlib.contextmanager
def task_identity(run_id: int, node_id: int, task_id: int) -> Iterator[None]:
    """Messages built inside are stamped with these ids, as inside a ServerApp; restored after."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, node_id, task_id
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved
