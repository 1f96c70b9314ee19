"""The simulation engine's functions Basin replaces (clients/simulation_engine.py), and the
link state, node registration and run contexts it reads."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from clients.flower_internals.releases import (
    ENGINE_MODULE,
    LINK_STATE_MODULE,
    RAY_BACKEND_MODULE,
    RUN_INFO_STORE_MODULE,
    replaced,
    speed_up_available,
)


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
