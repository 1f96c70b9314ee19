"""Client discovery: the nodes of a federation and the partition each one holds, learnt once
before round 1 (in simulation from the engine, in a deployment by asking every node), with
what a node that holds its own data holds, checked against the run.

Node ids are random per start of a federation: Basin samples and orders by partition id
(strategies/sampling.py), which discovery maps to the nodes. A federation whose nodes have
no partition id names them instead (node config ``node-name``, which survives a restart of
the node and of the SuperLink): the sorted names are partitions 0 … N − 1 (a resumed run
keeps its checkpoint's order, a node that joins later takes the next id), and every message
to a named node carries its id (strategies/exchange.py).
"""

from __future__ import annotations

import time
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from clients.log import log
from clients.simulation_engine import simulated_partitions
from strategies.exchange import ASSIGNED_PARTITIONS, send_and_receive


class NodeDiscoveryError(RuntimeError):
    """The connected nodes do not form the federation the run config describes."""


class Federation(dict):
    """{node id: partition id}; ``names``: partition p's node name at index p, for a
    federation of named nodes (None where the nodes hold partition ids); ``data_problems``:
    {partition: why the node cannot read its own data}, the nodes whose rounds will fail."""

    def __init__(self, partition_of_node: dict[int, int], names: list[str] | None = None,
                 data_problems: dict[int, str] | None = None):
        super().__init__(partition_of_node)
        self.names = names
        self.data_problems = data_problems or {}


def discover_partitions(grid: Grid, num_clients: int, timeout: float,
                        data_fits: tuple[int, tuple[int, ...]] | None = None,
                        known_names: list[str] | None = None) -> Federation:
    """Wait for ``num_clients`` nodes, learn each one's partition id, return {node id: partition id}.

    In a simulation the engine's own map is read (clients/simulation_engine.py): the same
    ids the nodes' ``node_config`` holds, without a message through every client process.
    Otherwise each node is asked (a ``query`` message).

    Raises :class:`NodeDiscoveryError` when fewer nodes connect or answer within
    ``timeout`` seconds (run-config key ``node-timeout``), when their partitions do not
    form the federation the run config describes, or when a node's own data does not fit
    ``data_fits`` (the run's number of classes and input shape). ``known_names``: a resumed
    run's order of named nodes.
    """
    ASSIGNED_PARTITIONS.clear()  # a former run's named nodes (this process's)
    log.info(f"discovering clients: the partition of each of {num_clients} nodes")
    simulated = simulated_partitions(timeout)
    if simulated is not None:
        log.info("partitions read from the simulation engine (no query round)")
        return Federation(checked_federation(simulated, {}, num_clients))
    log.info(f"asking {num_clients} nodes for their partition")
    deadline = time.monotonic() + timeout
    while len(node_ids := sorted(grid.get_node_ids())) < num_clients:
        if time.monotonic() > deadline:
            raise NodeDiscoveryError(
                f"only {len(node_ids)} of num-clients = {num_clients} nodes connected within node-timeout = "
                f"{timeout:g} s; in simulation pass --federation-config 'num-supernodes={num_clients}', in a "
                f"deployment start {num_clients} SuperNodes (or raise node-timeout)"
            )
        time.sleep(0.5)
    partition_of_node, problems, names, data_problems = query_partitions(grid, node_ids, num_clients, timeout, data_fits)
    if names and not problems:
        federation = named_federation(partition_of_node, names, num_clients, known_names or [])
    else:
        federation = Federation(checked_federation(partition_of_node, problems, num_clients))
    federation.data_problems = {federation[node]: problem for node, problem in data_problems.items()}
    return federation


def named_federation(partition_of_node: dict[int, int], names: dict[int, str], num_clients: int,
                     known_names: list[str]) -> Federation:
    """The federation of named nodes: partition p is the p-th of ``known_names`` followed by
    the other names sorted; NodeDiscoveryError where some nodes hold partition ids and some
    names only, or two nodes share a name."""
    if partition_of_node:
        raise NodeDiscoveryError(
            f"nodes {sorted(partition_of_node)[:5]} hold partition ids and nodes {sorted(names)[:5]} only a node-name; "
            f"give every node a partition-id (0..{num_clients - 1}) or every node a distinct node-name"
        )
    by_name: dict[str, list[int]] = {}
    for node, name in names.items():
        by_name.setdefault(name, []).append(node)
    shared = {name: nodes for name, nodes in by_name.items() if len(nodes) > 1}
    if shared:
        name, nodes = sorted(shared.items())[0]
        raise NodeDiscoveryError(f"nodes {sorted(nodes)} all have node-name = {name!r}; each node needs its own name")
    order = [*known_names, *sorted(set(by_name) - set(known_names))]
    if len(by_name) < num_clients:  # more may answer: nodes that joined a resumed run before its checkpoint
        raise NodeDiscoveryError(f"{len(by_name)} named nodes answered, but num-clients = {num_clients}")
    return Federation({node: order.index(name) for node, name in names.items()}, order)


def checked_federation(partition_of_node: dict[int, int], problems: dict[int, str], num_clients: int) -> dict[int, int]:
    """``partition_of_node`` when no node had a problem and the partitions are each of
    0..num_clients − 1 once; else NodeDiscoveryError saying what is wrong."""
    if problems:
        raise NodeDiscoveryError("; ".join(f"node {node}: {reason}" for node, reason in sorted(problems.items())[:10]))
    found = sorted(partition_of_node.values())
    if found != list(range(num_clients)):
        raise NodeDiscoveryError(
            f"nodes hold partition ids {found[:20]}{'…' if len(found) > 20 else ''}, expected each of "
            f"0..{num_clients - 1} once (num-clients = {num_clients}; in simulation pass --federation-config "
            f"'num-supernodes={num_clients}')"
        )
    return partition_of_node


def query_partitions(
    grid: Grid, node_ids: list[int], num_clients: int, timeout: float,
    data_fits: tuple[int, tuple[int, ...]] | None = None,
) -> tuple[dict[int, int], dict[int, str], dict[int, str], dict[int, str]]:
    """Ask ``node_ids`` for their partition (a ``query`` message).

    Returns {node id: partition id} of the nodes that answered well with one, {node id: what
    went wrong} of the others (an error, another num-partitions, or no answer in time),
    {node id: node-name} of those that answered well with a name only, and {node id: why it
    cannot read its own data} of the nodes among these whose rounds will fail for it.
    """
    messages = [
        Message(content=RecordDict({"config": ConfigRecord()}), dst_node_id=node_id, message_type=MessageType.QUERY)
        for node_id in node_ids
    ]
    partition_of_node: dict[int, int] = {}
    names: dict[int, str] = {}
    data_problems: dict[int, str] = {}
    problems = {node_id: f"did not report its partition within {timeout:g} s" for node_id in node_ids}
    for reply in send_and_receive(grid, messages, timeout):
        node_id = reply.metadata.src_node_id
        if reply.has_error():
            problems[node_id] = f"failed to report its partition: {reply.error.reason}"
            continue
        info = reply.content["partition"]
        misfit = node_data_misfit(info, data_fits)
        if misfit:
            problems[node_id] = misfit
            continue
        if "data-problem" in info:  # its rounds fail with it, named in results.csv and the summary; the others train
            data_problems[node_id] = str(info["data-problem"])
            log.warning(f"node {node_id} ({info.get('node-name') or 'partition ' + str(info['partition-id'])}): "
                        f"{info['data-problem']}")
        if "partition-id" not in info:  # a named node: discover_partitions ranks the names
            names[node_id] = str(info["node-name"])
            del problems[node_id]
            continue
        if int(info["num-partitions"]) != num_clients:
            problems[node_id] = (
                f"has num-partitions = {info['num-partitions']} but the run config says num-clients = "
                f"{num_clients}; they must match"
            )
            continue
        partition_of_node[node_id] = int(info["partition-id"])
        del problems[node_id]
    return partition_of_node, problems, names, data_problems


def node_data_misfit(info: Any, data_fits: tuple[int, tuple[int, ...]] | None) -> str:
    """Why a node's own data (its query reply's ``info``) does not fit the run's number of
    classes and input shape ``data_fits``; "" when it does or the node holds no data of its own."""
    if data_fits is None or "largest-label" not in info:
        return ""
    num_classes, input_shape = data_fits
    shape = tuple(int(side) for side in info["input-shape"])
    if int(info["largest-label"]) >= num_classes:
        return (f"holds label {info['largest-label']} in its {info['examples']} examples, but the run has {num_classes} "
                f"classes (labels 0..{num_classes - 1})")
    if shape != tuple(input_shape):
        return f"holds inputs of shape {shape}, but the run's model takes {tuple(input_shape)}"
    return ""
