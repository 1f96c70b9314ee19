"""Basin's replacements for parts of Flower's simulation engine, in the process that runs it.

Each does what Flower's function does, sooner or once instead of many times:

- :func:`add_messages_to_queue_on_store`: the engine's hand-out scan, woken when the
  ServerApp stores a message (Flower's scans every node every 0.1 s) and asking only the
  nodes messages were stored for; it also signals each stored reply (:func:`wait_for_reply`)
  and publishes the engine's {node id: partition id} (:func:`simulated_partitions`), so
  the ServerApp in the same process finds its clients without a query round;
- :func:`register_node_info_stores_once`: the nodes' contexts from one read of the run
  config, each built when its node first gets a message;
- :func:`register_nodes_at_once`: the K simulated nodes added to the link state in one pass;
- :func:`init_ray_sharing_workers`: Ray started without the job ``runtime_env`` that kept
  the client actors off Ray's prestarted workers, and without the dashboard's API server.

They are installed before Flower's engine starts, by Basin's own simulation command only
(:func:`run_flower_simulation`, the run's ``flwr-simulation``): importing Basin, in a
user's own Flower app too, changes nothing in Flower. Flower's private names are touched
only through clients/flower_internals/, which checks the installed release's sources:
on any other, or with ``BASIN_SPEEDUPS=off`` or ``BASIN_ENGINE_WAKEUP=off``, the engine
runs unchanged. What each saves, measured: docs/speed.md ("The engine's replacements").
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from queue import Queue
from typing import Any

from clients import flower_internals
from clients.log import log

SWITCH = "BASIN_ENGINE_WAKEUP"
# Flower's own interval: the longest a scan waits for a store before looking again.
MAX_WAIT_S = 0.1


# The running engine's {node id: partition id}, published when its scan thread starts.
_engine_nodes: dict[int, int] = {}
_engine_nodes_published = threading.Event()
# Set whenever the running engine stores a client's reply in the link state.
_reply_stored = threading.Event()


def add_messages_to_queue_on_store(state, queue: Queue, nodes_mapping: dict[int, int], f_stop: threading.Event) -> None:
    """Put messages from the link state into the engine's queue, as Flower's function does
    (one per node per scan), scanning again as soon as a message is stored.

    The first scan asks the nodes that messages stored before the wrapper was in place wait
    for (read from the state's store: asking each of 10⁶ nodes, as Flower's scan does, took
    minutes before round 1); every later one asks only the nodes that messages were stored
    for since (in ``nodes_mapping`` order), and forgets a node once it has nothing left. Every message
    reaches the state through the wrapped ``store_message_ins``, so no other node can have
    one. The state's ``get_message_ins`` checks every stored message for every node it is
    asked about (with a federation look-up each): Flower's scan of all nodes every 0.1 s
    cost K × (messages in flight) checks per scan, under the lock the ServerApp's stores
    and pulls wait on. At K = 10,000 clients that was most of a round's overhead, growing
    with K at a fixed cohort; now a scan costs the cohort, not K.
    """
    stored = threading.Event()
    order = {node_id: index for index, node_id in enumerate(nodes_mapping)}
    waiting: set[int] = set()  # nodes a message was stored for, not yet found without one
    waiting_lock = threading.Lock()

    def note_destination(message) -> None:
        with waiting_lock:
            waiting.add(message.metadata.dst_node_id)

    state.store_message_ins = signalling(state.store_message_ins, stored, note_destination)
    state.store_message_res = signalling(state.store_message_res, _reply_stored)
    _engine_nodes.update(nodes_mapping)
    _engine_nodes_published.set()
    log.info("simulation engine: messages reach the client processes when stored (clients/simulation_engine.py)")
    try:
        first = True  # the first scan also hands out what was stored before the wrapper
        while not f_stop.is_set():
            stored.clear()  # before the scan: a message stored during it wakes the next one
            with waiting_lock:
                if first:  # messages stored before the wrapper: their nodes (Flower's scan asks all K)
                    waiting.update(flower_internals.undelivered_destinations(state))
                nodes = sorted(waiting, key=lambda node: order.get(node, len(order)))
            first = False
            found = False
            for node_id in nodes:
                with waiting_lock:  # a store for this node after an empty answer keeps it waiting
                    messages = state.get_message_ins(node_id=node_id, limit=1)
                    if not messages:
                        waiting.discard(node_id)
                for message in messages:
                    queue.put(message)
                    found = True
            if not found:  # a node with several messages gets the next one without waiting
                stored.wait(MAX_WAIT_S)
    finally:  # the map describes this engine only while it runs
        _engine_nodes_published.clear()
        _engine_nodes.clear()


add_messages_to_queue_on_store.installed_by_basin = True


def signalling(store, event: threading.Event, before_signal: Callable[[Any], None] | None = None):
    """``store`` (a link-state method), setting ``event`` after every call (after
    ``before_signal(message)``, when given)."""

    def store_and_signal(message):
        result = store(message)
        if before_signal is not None:
            before_signal(message)
        event.set()
        return result

    return store_and_signal


class NodeStores(dict):
    """{node id: its run-info store}, a store built by ``store_of(node id)`` when first
    looked up: at K = 10⁶ simulated nodes, only the nodes that get a message have one."""

    def __init__(self, store_of: Callable[[int], Any]):
        super().__init__()
        self._store_of = store_of
        self._lock = threading.Lock()  # the engine's worker threads look stores up at once

    def __missing__(self, node_id: int):
        with self._lock:
            if not dict.__contains__(self, node_id):
                self[node_id] = self._store_of(node_id)
            return dict.__getitem__(self, node_id)


def register_node_info_stores_once(nodes_mapping: dict[int, int], run, app_dir: str | None = None) -> dict:
    """Flower's ``_register_node_info_stores`` (a ``DeprecatedRunInfoStore`` per node, its
    run's context registered), reading the app's run config once for all nodes instead of
    once per node, sharing it, and building each other node's store when the engine first
    asks for it (see the module docstring)."""
    from flwr.app import Context, RecordDict

    store_class, run_info_class = flower_internals.run_info_store_classes()
    partition_id_key, num_partitions_key = flower_internals.partition_keys()
    num_partitions = len(set(nodes_mapping.values()))

    def new_store(node_id: int):
        return store_class(node_id=node_id, node_config={partition_id_key: nodes_mapping[node_id],
                                                         num_partitions_key: num_partitions})

    first_node = next(iter(nodes_mapping))
    first = new_store(first_node)
    first.register_context(run_id=run.run_id, run=run, app_dir=app_dir)  # Flower's own registration, once
    run_config = first.run_infos[run.run_id].initial_run_config

    def store_of(node_id: int):
        store = new_store(node_id)  # KeyError for a node the engine does not simulate, as Flower's dict
        context = Context(run_id=run.run_id, node_id=node_id, node_config=store.node_config, state=RecordDict(),
                          run_config=run_config)
        store.run_infos[run.run_id] = run_info_class(initial_run_config=run_config, context=context)
        return store

    stores = NodeStores(store_of)
    stores[first_node] = first
    log.info(f"simulation engine: {len(nodes_mapping)} node contexts from one read of the run config, each "
             "built when its node first gets a message (clients/simulation_engine.py)")
    return stores


register_node_info_stores_once.installed_by_basin = True


def register_nodes_at_once(num_nodes: int, state_factory) -> dict[int, int]:
    """Flower's ``_register_nodes``: ``num_nodes`` simulated nodes in the link state, online,
    and {node id: partition id}, the partitions in registration order; the records built
    at once (see the module docstring)."""
    node_ids = flower_internals.add_online_nodes(state_factory, num_nodes)
    log.info(f"simulation engine: {num_nodes} nodes registered at once (clients/simulation_engine.py)")
    return {node_id: partition_id for partition_id, node_id in enumerate(node_ids)}


register_nodes_at_once.installed_by_basin = True


def init_ray_sharing_workers(backend, backend_config: dict) -> None:
    """Flower 1.41's ``RayBackend.init_ray``, passing ``PYTHONPATH`` through the environment
    only when it starts Ray here (see the module docstring)."""
    import ray

    if ray.is_initialized():
        return
    init_args = {**(backend_config.get(backend.init_args_key) or {})}
    init_args.setdefault("include_dashboard", False)
    # Flower's own line: Ray's processes inherit the environment, not this process's sys.path.
    pythonpath = os.pathsep.join(sys.path)
    if os.environ.get("PYTHONPATH"):
        pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
    os.environ["PYTHONPATH"] = pythonpath
    if os.environ.get("RAY_ADDRESS") or "address" in init_args:
        ray.init(runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}, **init_args)
    else:
        flower_internals.init_ray(**init_args)


init_ray_sharing_workers.installed_by_basin = True


def install_engine_wakeup() -> bool:
    """Install this module's replacements in this process when it runs Flower's
    simulation engine (of the release they were written for); True when they are in place."""
    if os.environ.get(SWITCH, "on") == "off":
        return False
    if not (flower_internals.replace_engine_functions(add_messages_to_queue_on_store, register_node_info_stores_once,
                                                      register_nodes_at_once)
            and flower_internals.replace_ray_init(init_ray_sharing_workers)):
        return False
    from clients.client_actor import actor_class  # imports Ray: only where an engine runs

    return flower_internals.replace_client_actor(actor_class())


def run_flower_simulation() -> int:
    """Flower's ``flwr-simulation`` command, with this module's replacements installed before
    Flower's simulation process starts its engine (the run's ``flwr-simulation``, see
    experiments/runtime/launch.py)."""
    if not flower_internals.speed_ups_off_because():  # else nothing private is imported: Flower's command as it is
        flower_internals.load_engine()  # Flower's command imports it too; loaded here, the replacements go in first
        install_engine_wakeup()  # nothing with BASIN_ENGINE_WAKEUP=off
    from flwr.simulation.app import flwr_simulation

    return flwr_simulation()


def wait_for_reply(seconds: float) -> None:
    """Wait up to ``seconds``, returning early once the engine stores a reply (after
    :func:`expect_replies`); a plain sleep where no engine runs in this process."""
    _reply_stored.wait(seconds)


def expect_replies() -> None:
    """Forget earlier replies' signal: call before pulling, so that a reply stored during
    or after the pull ends the next :func:`wait_for_reply`."""
    _reply_stored.clear()


def engine_wakeup_installed() -> bool:
    """Whether Basin's simulation command put this module's replacements in this process's engine."""
    return flower_internals.engine_function("add_messages_to_queue") is add_messages_to_queue_on_store


def simulated_partitions(timeout: float) -> dict[int, int] | None:
    """{node id: partition id} of the simulated SuperNodes when this process runs Flower's
    simulation engine with the replacement (Basin's simulation command), waiting up to
    ``timeout`` seconds for the engine to start; None where nodes must be asked (no engine
    in this process, Flower's own command, or ``BASIN_ENGINE_WAKEUP=off``) or the engine
    did not start in time."""
    if not engine_wakeup_installed() or not _engine_nodes_published.wait(timeout):
        return None
    return dict(_engine_nodes)
