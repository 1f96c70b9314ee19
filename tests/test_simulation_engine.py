"""Basin's one change to Flower's simulation engine (clients/simulation_engine.py):
messages are handed to the client actors when stored, on exactly the Flower releases they were checked against."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import defaultdict
from queue import Queue
from types import SimpleNamespace

import pytest
from conftest import REPO

import clients.simulation_engine as engine
from clients import flower_internals
from clients.simulation_engine import add_messages_to_queue_on_store, install_engine_wakeup


class FakeLinkState:
    """The methods of Flower's LinkState the engine's threads use."""

    def __init__(self):
        self.inbox = defaultdict(list)
        self.replies = []
        self.asked = []  # node ids, in the order get_message_ins was called for them
        self.lock = threading.Lock()

    def store_message_res(self, reply):
        with self.lock:
            self.replies.append(reply)

    def store_message_ins(self, message):
        with self.lock:
            self.inbox[message.metadata.dst_node_id].append(message.text)
        return message.text

    @property
    def message_ins_store(self):  # Flower's {message id: message}, undelivered ones only here
        return {f"{node}-{i}": SimpleNamespace(metadata=SimpleNamespace(dst_node_id=node, delivered_at=""))
                for node, texts in self.inbox.items() for i in range(len(texts))}

    def get_message_ins(self, node_id, limit):
        with self.lock:
            self.asked.append(node_id)
            taken, self.inbox[node_id] = self.inbox[node_id][:limit], self.inbox[node_id][limit:]
        return taken


def _message(node_id: int, text: str) -> SimpleNamespace:
    return SimpleNamespace(metadata=SimpleNamespace(dst_node_id=node_id), text=text)


def _start_scan(state, queue, nodes_mapping, stop) -> threading.Thread:
    """The engine's scan thread, returned once it has wrapped the store and gone to sleep."""
    original_store = state.store_message_ins
    scan = threading.Thread(target=add_messages_to_queue_on_store, args=(state, queue, nodes_mapping, stop))
    scan.start()
    while state.store_message_ins == original_store:  # the scan wraps the store first
        threading.Event().wait(0.01)
    threading.Event().wait(0.2)  # the scan is now asleep
    return scan


def _stop_scan(scan, state, stop) -> None:
    stop.set()
    state.store_message_ins(_message(next(iter(state.inbox), 0), "wake up to stop"))
    scan.join(timeout=5)
    assert not scan.is_alive()


def test_another_flower_runs_the_engine_unchanged_and_says_so_once(monkeypatch, capsys):
    """A speed-up, not a requirement: on another release (or source) nothing is replaced."""
    from flwr.server.superlink.fleet.vce import vce_api

    monkeypatch.setattr(vce_api, "add_messages_to_queue", flower_internals.original(
        f"{flower_internals.ENGINE_MODULE}:add_messages_to_queue"))
    monkeypatch.setattr(vce_api, "_register_node_info_stores", flower_internals.original(
        f"{flower_internals.ENGINE_MODULE}:_register_node_info_stores"))
    monkeypatch.setattr(flower_internals.releases, "installed_flower", lambda: "1.43.0")
    flower_internals.speed_up_available.cache_clear()
    try:
        assert not install_engine_wakeup() and not install_engine_wakeup()
        assert vce_api.add_messages_to_queue is not add_messages_to_queue_on_store
        out = capsys.readouterr().err
        assert out.count("engine speed-up off, Flower's own code runs instead: this is flwr 1.43.0, not 1.41.0 or 1.42.0") == 1
    finally:
        flower_internals.speed_up_available.cache_clear()


def test_a_stored_message_is_handed_out_without_waiting_for_the_scan_interval(monkeypatch):
    monkeypatch.setattr(engine, "MAX_WAIT_S", 60.0)  # only a wake-up can deliver within the test's seconds
    state, queue, stop = FakeLinkState(), Queue(), threading.Event()
    scan = _start_scan(state, queue, {11: 0, 22: 1}, stop)
    try:
        state.store_message_ins(_message(22, "train 1"))
        assert queue.get(timeout=5) == "train 1"
        state.store_message_ins(_message(11, "query"))
        state.store_message_ins(_message(11, "train 2"))  # two for one node: both, one per scan
        assert {queue.get(timeout=5), queue.get(timeout=5)} == {"query", "train 2"}
    finally:
        _stop_scan(scan, state, stop)


def test_a_scan_asks_only_the_nodes_messages_were_stored_for(monkeypatch):
    """Each get_message_ins call checks every stored message: asking all 100 nodes on every
    store was most of a round's hand-out time, and asking all K every 0.1 s made a round's
    overhead grow with K (18x at 10,000 clients). The first scan hands out messages stored
    before it started (a user's ServerApp may not wait for the engine) asking only their
    nodes: Flower's asks every node, minutes at 10⁶ nodes."""
    monkeypatch.setattr(engine, "MAX_WAIT_S", 60.0)
    nodes = {1000 + 7 * p: p for p in range(100)}
    state, queue, stop = FakeLinkState(), Queue(), threading.Event()
    state.inbox[1070].append("stored before the scan")
    scan = _start_scan(state, queue, nodes, stop)
    try:
        assert queue.get(timeout=5) == "stored before the scan"
        assert set(state.asked) == {1070}  # not the 99 nodes without a message
        state.asked.clear()
        for node_id in (1007, 1693, 1007):
            state.store_message_ins(_message(node_id, f"train {node_id}"))
        assert sorted(queue.get(timeout=5) for _ in range(3)) == ["train 1007", "train 1007", "train 1693"]
        threading.Event().wait(0.2)
        assert set(state.asked) == {1007, 1693}
        assert state.asked.count(1007) >= 3  # two messages, one per scan, then one empty answer
        state.asked.clear()
        monkeypatch.setattr(engine, "MAX_WAIT_S", 0.05)
        state.store_message_ins(_message(1014, "train 1014"))  # wakes the scan, which then waits 0.05 s
        assert queue.get(timeout=5) == "train 1014"
        threading.Event().wait(0.5)  # ten idle scans
        assert set(state.asked) == {1014}  # the node asked until it had nothing left; no other
    finally:
        _stop_scan(scan, state, stop)


def test_installed_only_in_the_engine_process_and_only_when_switched_on(monkeypatch):
    from flwr.server.superlink.fleet.vce import vce_api

    monkeypatch.setattr(vce_api, "add_messages_to_queue", vce_api.add_messages_to_queue)  # restored after the test
    monkeypatch.setattr(vce_api, "_register_node_info_stores", vce_api._register_node_info_stores)
    monkeypatch.setattr(vce_api, "_register_nodes", vce_api._register_nodes)
    from flwr.server.superlink.fleet.vce.backend import raybackend

    monkeypatch.setattr(raybackend, "ClientAppActor", raybackend.ClientAppActor)
    monkeypatch.setenv("BASIN_ENGINE_WAKEUP", "off")
    assert not install_engine_wakeup()
    monkeypatch.delenv("BASIN_ENGINE_WAKEUP")
    with monkeypatch.context() as m:
        m.delitem(sys.modules, flower_internals.ENGINE_MODULE)  # a client process or SuperNode: no engine here
        assert not install_engine_wakeup()
    assert vce_api.add_messages_to_queue is not add_messages_to_queue_on_store
    assert install_engine_wakeup() and install_engine_wakeup()  # idempotent
    assert vce_api.add_messages_to_queue is add_messages_to_queue_on_store
    assert vce_api._register_node_info_stores is engine.register_node_info_stores_once
    assert vce_api._register_nodes is engine.register_nodes_at_once
    assert raybackend.RayBackend.init_ray is engine.init_ray_sharing_workers
    from clients.client_actor import RemoteClientAppActor

    assert raybackend.ClientAppActor is RemoteClientAppActor


@pytest.mark.parametrize("ray_address", [None, "10.0.0.5:6379"])
def test_the_engines_own_ray_starts_without_a_job_runtime_env_so_actors_take_prestarted_workers(
    monkeypatch, ray_address
):
    """Flower's init_ray passes PYTHONPATH as the job's runtime_env, so Ray's prestarted
    workers (no runtime env) never match an actor; Basin's passes it through the
    environment when Ray starts here, and keeps Flower's call when it joins a cluster."""
    import ray
    from ray._private import node

    calls, api_servers = [], []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: (calls.append(kwargs), api_servers.append(node.Node.start_api_server)))
    monkeypatch.setenv("PYTHONPATH", "/earlier")
    if ray_address:
        monkeypatch.setenv("RAY_ADDRESS", ray_address)
    else:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    backend = SimpleNamespace(init_args_key="init_args")
    engine.init_ray_sharing_workers(backend, {"init_args": {"num_cpus": 2}})
    expected_path = f"{engine.os.pathsep.join(sys.path)}{engine.os.pathsep}/earlier"
    assert engine.os.environ["PYTHONPATH"] == expected_path  # what Ray's processes inherit, as with Flower
    if ray_address:
        assert calls == [{"runtime_env": {"env_vars": {"PYTHONPATH": expected_path}}, "num_cpus": 2,
                          "include_dashboard": False}]
    else:
        assert calls == [{"num_cpus": 2, "include_dashboard": False}]
    # The head it starts has no dashboard API server (flower_internals.init_ray); a joined cluster is Ray's own.
    assert (api_servers[0] is node.Node.start_api_server) == bool(ray_address)


def test_node_contexts_are_flowers_from_one_read_of_the_run_config(tmp_path, monkeypatch):
    """The same stores as Flower's _register_node_info_stores (node config, run config,
    an empty state per node), with pyproject.toml read once, not once per node."""
    from flwr.compat.client import run_info_store
    from flwr.supercore.run import Run

    original = flower_internals.original(f"{flower_internals.ENGINE_MODULE}:_register_node_info_stores")
    assert not getattr(original, "installed_by_basin", False)
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\nversion = "1.0.0"\n[tool.flwr.app]\npublisher = "p"\n'
        '[tool.flwr.app.components]\nserverapp = "a:b"\nclientapp = "a:c"\n'
        '[tool.flwr.app.config]\nlr = 0.1\nname = "digits"\n')
    run = Run.create_empty(run_id=7)
    run.override_config = {"lr": 0.5}
    reads = []
    real_read = run_info_store.get_fused_config_from_dir
    monkeypatch.setattr(run_info_store, "get_fused_config_from_dir", lambda *a: reads.append(a) or real_read(*a))
    nodes = {101 + 3 * i: i for i in range(50)}
    stores = engine.register_node_info_stores_once(nodes, run, app_dir=str(tmp_path))
    assert len(reads) == 1
    assert list(stores) == [101]  # the first node's, from Flower's own registration; the others when asked
    with pytest.raises(KeyError):
        stores[100]  # not a simulated node
    for node_id, partition_id in nodes.items():
        context = stores[node_id].retrieve_context(7)
        assert context.node_id == node_id and context.run_id == 7
        assert dict(context.node_config) == {"partition-id": partition_id, "num-partitions": 50}
        assert dict(context.run_config) == {"lr": 0.5, "name": "digits"} and len(context.state) == 0
    assert list(stores) == list(nodes) and stores[104] is stores[104]
    flowers = original(nodes, run, app_dir=str(tmp_path))  # Flower's own, for the same nodes: the same contexts
    assert len(reads) == 1 + len(nodes)
    for node_id in nodes:
        ours, theirs = stores[node_id].retrieve_context(7), flowers[node_id].retrieve_context(7)
        assert (dict(ours.node_config), dict(ours.run_config)) == (dict(theirs.node_config), dict(theirs.run_config))
    stores[101].update_context(7, stores[101].retrieve_context(7))  # the engine's check after a client's round


def _link_state_factory():
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.superlink.federation import NoOpFederationManager

    return LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())


def _record(node) -> dict:
    """A node record's fields, without those drawn at random or read from the clock."""
    fields = {field.name: value for field, value in node.ListFields()}
    return {name: value for name, value in fields.items()
            if name not in ("node_id", "public_key", "registered_at", "last_activated_at")}


def test_nodes_registered_at_once_are_the_records_flowers_registration_leaves():
    flowers_registration = flower_internals.original(f"{flower_internals.ENGINE_MODULE}:_register_nodes")
    assert not getattr(flowers_registration, "installed_by_basin", False)
    theirs_factory, ours_factory = _link_state_factory(), _link_state_factory()
    theirs = flowers_registration(20, theirs_factory)
    ours = engine.register_nodes_at_once(20, ours_factory)
    for mapping, state in ((theirs, theirs_factory.state()), (ours, ours_factory.state())):
        assert list(mapping.values()) == list(range(20)) and list(mapping) == list(state.nodes)
        assert set(state.owner_to_node_ids) == {state.nodes[next(iter(mapping))].owner_aid}
        assert next(iter(state.owner_to_node_ids.values())) == set(mapping)
        assert {state.node_public_key_to_node_id[node.public_key] for node in state.nodes.values()} == set(mapping)
        assert {len(node.public_key) for node in state.nodes.values()} == {32}
        assert len(state.get_node_info(statuses=["online"])) == 20  # Flower's query, after its offline check
    reference = _record(next(iter(theirs_factory.state().nodes.values())))
    assert reference["status"] == "online" and reference["online_until"] > 1e299
    assert all(_record(node) == reference for node in ours_factory.state().nodes.values())
    registered = {node.registered_at for node in ours_factory.state().nodes.values()}
    assert len(registered) == 1 and registered == {node.last_activated_at for node in ours_factory.state().nodes.values()}


def test_nodes_registered_at_once_draw_again_where_an_id_or_a_key_is_taken(monkeypatch):
    """As create_node: never the SuperLink's id or 0, never an id or public key twice."""
    from flwr.common.constant import SUPERLINK_NODE_ID

    def node_id_bytes(value: int) -> bytes:
        return value.to_bytes(8, "little")

    key_a, key_b, key_c = b"a" * 32, b"b" * 32, b"c" * 32
    draws = [node_id_bytes(5) + node_id_bytes(5) + node_id_bytes(SUPERLINK_NODE_ID), key_a + key_b + key_a,
             node_id_bytes(7), node_id_bytes(0), node_id_bytes(9), key_c]
    monkeypatch.setattr("os.urandom", lambda size: draws.pop(0))
    factory = _link_state_factory()
    assert engine.register_nodes_at_once(3, factory) == {5: 0, 7: 1, 9: 2}
    assert not draws
    assert factory.state().node_public_key_to_node_id == {key_a: 5, key_b: 7, key_c: 9}


def test_basins_flwr_simulation_installs_every_replacement_before_flowers_command_runs():
    """Flower registers the nodes as soon as its simulation process starts the engine: the
    replacement must be in place before Flower's command runs (a fresh process)."""
    code = ("import sys\n"
            "import flwr.simulation.app\n"
            "def flowers_command():\n"
            "    from flwr.server.superlink.fleet.vce import vce_api\n"
            "    print(all(getattr(getattr(vce_api, name), 'installed_by_basin', False) for name in\n"
            "              ('_register_nodes', '_register_node_info_stores')))\n"
            "    return 5\n"
            "flwr.simulation.app.flwr_simulation = flowers_command\n"
            "from clients.simulation_engine import run_flower_simulation\n"
            "sys.exit(run_flower_simulation())\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout.strip()) == (5, "True"), result.stderr[-2000:]


def test_the_serverapp_reads_the_engines_partitions_while_it_runs_and_nothing_otherwise(monkeypatch):
    from flwr.server.superlink.fleet.vce import vce_api

    monkeypatch.setattr(vce_api, "add_messages_to_queue", vce_api.add_messages_to_queue)  # restored after the test
    assert engine.simulated_partitions(timeout=0.05) is None  # no engine running in this process
    state, stop = FakeLinkState(), threading.Event()
    scan = threading.Thread(target=add_messages_to_queue_on_store, args=(state, Queue(), {907: 1, 31: 0}, stop))
    scan.start()
    try:
        # Flower's own engine (its own command, or a user's app that imported Basin): the nodes must be asked.
        assert engine.simulated_partitions(timeout=5) is None
        monkeypatch.setattr(vce_api, "add_messages_to_queue", add_messages_to_queue_on_store)  # Basin's command did
        assert engine.simulated_partitions(timeout=5) == {907: 1, 31: 0}
    finally:
        stop.set()
        scan.join(timeout=5)
    assert engine.simulated_partitions(timeout=0.05) is None  # that engine has stopped


def test_discovery_in_a_simulation_sends_no_message_and_checks_the_federation(monkeypatch):
    """The engine's map is the answer: no query reaches a client process; a map that is
    not the run's federation (another num-supernodes) is refused as the query round would."""
    from strategies.discovery import NodeDiscoveryError, discover_partitions

    class NoMessagesGrid:
        def get_node_ids(self):
            return [31, 907]

        def send_and_receive(self, *args, **kwargs):
            raise AssertionError("discovery sent messages in a simulation")

        push_messages = pull_messages = send_and_receive

    monkeypatch.setattr(engine, "simulated_partitions", lambda timeout: {907: 1, 31: 0})
    monkeypatch.setattr("strategies.discovery.simulated_partitions", engine.simulated_partitions)
    assert discover_partitions(NoMessagesGrid(), num_clients=2, timeout=1) == {907: 1, 31: 0}
    with pytest.raises(NodeDiscoveryError, match=r"partition ids \[0, 1\], expected each of 0\.\.2 once.*num-supernodes=3"):
        discover_partitions(NoMessagesGrid(), num_clients=3, timeout=1)


def test_a_stored_reply_ends_the_servers_wait_at_once(monkeypatch):
    """The round exchange's wait between pulls ends when the engine stores a reply, not at
    the next poll: a reply stored 1.1 s after the push is pulled well before the 2.05 s at
    which a poll backing off from 1 ms (to max_poll = 30 s) would look again."""
    from flwr.server.superlink.fleet.vce import vce_api

    from strategies.exchange import send_and_receive

    monkeypatch.setattr(vce_api, "add_messages_to_queue", vce_api.add_messages_to_queue)  # restored after the test
    state, stop = FakeLinkState(), threading.Event()
    scan = threading.Thread(target=add_messages_to_queue_on_store, args=(state, Queue(), {1: 0}, stop))
    scan.start()

    class EngineGrid:
        def push_messages(self, messages):
            threading.Timer(1.1, lambda: state.store_message_res("reply to m0")).start()  # the engine's injector
            return ["m0"]

        def pull_messages(self, message_ids):
            with state.lock:
                return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id="m0"), has_content=lambda: False)
                        for _ in state.replies]

    try:
        while state.store_message_res.__name__ == "store_message_res":  # the scan wraps the store first
            threading.Event().wait(0.01)
        started = time.monotonic()
        message = SimpleNamespace(metadata=SimpleNamespace(dst_node_id=1), has_content=lambda: False)
        replies = send_and_receive(EngineGrid(), [message], timeout=10, max_poll=30)
        waited = time.monotonic() - started
    finally:
        stop.set()
        scan.join(timeout=5)
    assert len(replies) == 1 and 1.1 <= waited < 1.5


def test_the_client_processes_first_message_also_waits_for_them_to_start():
    """In a simulation discovery sends nothing, so round 1 is what starts the client
    processes (seconds on 2 cores): its timeout adds node-timeout, later rounds do not."""
    from strategies.server_work import round_timeout

    config = {"round-timeout": 8.0, "node-timeout": 30.0}
    assert round_timeout(config, first_contact=True) == 38.0
    assert round_timeout(config, first_contact=False) == 8.0
