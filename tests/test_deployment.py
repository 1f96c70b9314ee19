"""Basin on Flower's Deployment Engine (real SuperLink and SuperNodes on localhost).

A federation of SuperNodes that each read their own folder (the simulation's partition,
written by experiments.write_partitions), over TLS with SuperNode authentication and with
federated evaluation (the ServerApp reads no data set), gives the same rounds and the same
final model as the simulation, for FedProx + IMA and for SCAFFOLD (its client state); a
SuperLink with SuperNode authentication admits registered nodes only (over TLS), and a
dead and a frozen SuperNode are each one failure a round (one deployment for both). No
process a test starts may outlive it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import tomllib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from experiments.certificates import write_supernode_key_pair
from experiments.runtime.deployment import LocalFederation, Security, deploy
from experiments.runtime.processes import alive, flwr_homes, process_table, process_tree, stop_process_tree
from experiments.runtime.run_config import resolve_config
from experiments.write_partitions import write_partitions

SHORT = {"num-rounds": 2, "local-epochs": 1, "device": "cpu"}
# 3 clients, 2 sampled per round (cohort_size: round(0.67 · 3) = 2), each scoring the round's
# models on its own held-out quarter (evaluation = federated).
NODES_OWN_DATA = {**SHORT, "num-clients": 3, "participation": 0.67, "evaluation": "federated", "client-evaluation": 0.25}
# IMA averages the window of rounds 1–2 and sends the average from round 2 on.
FEDPROX_IMA = {**NODES_OWN_DATA, "strategy": "fedprox", "averaging": "ima", "window": 2, "avg-start": 2}
SCAFFOLD = {**NODES_OWN_DATA, "strategy": "scaffold", "momentum": 0.0}
# The same configs in simulation, launched with the session's other reference runs
# (tests/conftest.py's flower_runs) instead of with a Ray of their own.
FLOWER_RUNS = {"deployment-simulated": FEDPROX_IMA, "deployment-simulated-scaffold": SCAFFOLD}


def _rounds(out_dir: Path) -> pd.DataFrame:
    """results.csv without its wall-clock columns (round-seconds, train-seconds …)."""
    rows = pd.read_csv(out_dir / "results.csv")
    return rows[[c for c in rows.columns if not c.endswith("-seconds")]]


ROUND_TIMEOUT = 20.0  # seconds (see _over_tls)


@dataclass
class OverTls:
    """What ``_over_tls`` saw of its deployment, for the test's assertions."""

    out: Path
    summary: dict
    nodes: list  # the 3 registered SuperNodes
    impostor: Any  # the SuperNode with an unregistered key
    restarted: Any  # the killed SuperNode, started again
    listed: set[int]  # the node ids the SuperLink lists at the end
    cli_config: dict  # the CLI's config.toml in the federation's homes
    port: int
    name: str
    work_dir: Path
    broken_after: int  # rounds written when the nodes were broken


def _over_tls(folder: Path, once_broken: Callable[[], None]) -> OverTls:
    """The TLS test's deployment (see its docstring); ``once_broken`` runs as soon as two of its
    nodes are broken, while round 2 waits `round-timeout` for them."""

    def freeze(process: subprocess.Popen) -> None:
        for pid in process_tree([process.pid], process_table()):
            os.kill(pid, signal.SIGSTOP)

    # A SuperNode starts a ClientApp process for each message (Flower's subprocess
    # isolation): round 1 of 3 nodes took 5.5 s on 2 cores with them forked from a warm
    # process (clients/warm_clientapp.py), 11 s with each importing Flower and torch, when
    # 5 nodes took 17 s and a round-timeout of 10 s failed every round once. The nodes break
    # once round 1's row is written, while round 2's ClientApps are starting, so round 2
    # already waits round-timeout for them: 12 s, over twice round 1's 5.1 s, when the three
    # nodes trained at once (in round 2 the healthy one trains alone). The test took 46 s
    # with 20 s, 37-38 s with 12 s (2 cores, 2026-12-05). But round 3's two nodes train while
    # the deployments on the nodes' own data start beside it (the fixture overlaps them),
    # and on 2 cores their replies came 12-13 s after the round's messages in 3 of 4 runs
    # (2026-12-07): 20 s (ROUND_TIMEOUT).
    # SCAFFOLD, whose nodes keep c_i: the killed node, restarted, goes on with its state.
    config = resolve_config({**SHORT, "num-clients": 3, "participation": 1.0, "min-replies": 1, "num-rounds": 3,
                             "round-timeout": ROUND_TIMEOUT, "strategy": "scaffold", "momentum": 0.0,
                             "checkpoint-every": 1})
    out = folder / "run"
    with LocalFederation(out, Security(tls=True, auth=True)) as federation, ThreadPoolExecutor(max_workers=1) as pool:
        # The impostor tries while the registered nodes start and the run goes on (its
        # retries until it gives up took 7 s of the test's wall time when waited for first).
        impostor_key = write_supernode_key_pair(folder / "keys", "impostor")
        impostor = federation.start_supernode(0, 3, impostor_key, wait=False, name="impostor")
        nodes = federation.start_supernodes(3)
        running = pool.submit(federation.run, config, out, False)
        deadline = time.monotonic() + 300
        while not (out / "results.csv").is_file() or len((out / "results.csv").read_text().splitlines()) <= 1:
            assert time.monotonic() < deadline and not running.done(), "the run never reached round 1"
            time.sleep(0.1)
        stop_process_tree([nodes[1].process.pid])
        freeze(nodes[2].process)
        broken_after = len((out / "results.csv").read_text().splitlines()) - 1
        once_broken()
        # The killed node starts again (a new process and node id, its partition in its node
        # config; a key of its own, registered) while round 2 waits for it: sampled in round 3.
        again_key = write_supernode_key_pair(folder / "keys", "supernode-1-again")
        federation.register(again_key.public_key)
        restarted = federation.start_supernode(1, 3, again_key, name="supernode-1-again")
        summary = running.result(timeout=600)
        impostor.process.wait(timeout=60)  # the SuperLink refused it, and it gave up
        listed = {int(node["node-id"]) for node in federation.list_supernodes()}
        cli_config = tomllib.loads((federation.work_dir / "homes" / "cli" / "config.toml").read_text())
    return OverTls(out, summary, nodes, impostor, restarted, listed, cli_config, federation.port, federation.name,
                   federation.work_dir, broken_after)


@dataclass
class Deployments:
    """``deployments``: the faults' one's outcome; those of the nodes on their own data, by
    reference run, with their folders; and the processes of any that still ran once all had ended."""

    over_tls: Future
    own_data: dict[str, Future]  # {} where their test is not selected
    own_data_folders: dict[str, Path]
    left: list[int]


@pytest.fixture(scope="module")
def deployments(flower_runs, tmp_path_factory) -> Deployments:
    """The deployments, those on the nodes' own data started once the faults' one's nodes are
    broken, one after the other: the first runs while the faults' run's round 2 waits
    `round-timeout` for them (that one alone left about 40 % of 2 cores idle), not before: its
    round 1 fills the 2 cores and must end within `round-timeout`. A deployment leaves no
    process behind (one that does is recognised by its FLWR_HOME, which LocalFederation puts
    in a basin-deploy- directory)."""
    before = set(flwr_homes())
    folders = {name: tmp_path_factory.mktemp(name) / "deployment" for name in FLOWER_RUNS if name in flower_runs}
    with ThreadPoolExecutor(max_workers=1) as beside, ThreadPoolExecutor(max_workers=1) as pool:
        started: dict[str, Future] = {}

        def start_own_data() -> None:
            for name, folder in folders.items():
                reference = flower_runs[name]
                # Its SuperNodes hold their own data: the simulation's partition, written to one folder each.
                node_data = write_partitions(reference.config, folder.parent / "node-data")[0].parent
                started[name] = beside.submit(deploy, reference.config, folder, Security(tls=True, auth=True),
                                              cpus_per_client=2.0, progress=False, node_data=node_data)

        over_tls = pool.submit(_over_tls, tmp_path_factory.mktemp("tls"), start_own_data)
        if over_tls.exception() is not None and not started:
            start_own_data()  # the faults' one failed before its nodes broke: these run alone
    left = [pid for pid, home in flwr_homes().items() if pid not in before and "/basin-deploy-" in home and alive(pid)]
    return Deployments(over_tls, started, folders, left)


@pytest.mark.slow
@pytest.mark.flower_runs("deployment-simulated", "deployment-simulated-scaffold")
@pytest.mark.parametrize("reference", ["deployment-simulated", "deployment-simulated-scaffold"],
                         ids=["fedprox+ima", "scaffold"])
def test_nodes_on_their_own_data_over_tls_give_the_simulations_rounds_and_model(flower_runs, deployments, reference):
    """SuperNodes each on their own folder (the simulation's partition, written by
    experiments.write_partitions), authenticated over TLS, scoring the rounds' models on
    their own held-out splits with no data set on the server, train to the simulation's
    bits: every metric, each node's scores and the model (FedProx + IMA; SCAFFOLD, whose
    nodes keep c_i across rounds)."""
    simulated = flower_runs[reference].completed()
    # SuperNodes of 2 CPUs (OMP_NUM_THREADS = 2) against simulated clients of 1: torch-threads
    # keeps both at one thread, so the bits agree however each is given CPUs.
    deployed, folder = deployments.own_data[reference].result(), deployments.own_data_folders[reference]

    assert deployed["status"] == "completed"
    assert deployed["evaluation"]["kind"] == "federated"
    superlink_log = (folder / "superlink.log").read_text()
    assert "Uvicorn running on https://" in superlink_log  # over TLS, the nodes' keys registered (--auth)
    a, b = _rounds(folder), _rounds(simulated)
    assert list(a.columns) == list(b.columns)
    assert (a["clients-ok"] == 2).all() and (a["clients-evaluated"] == 2).all()
    if reference == "deployment-simulated":
        assert a["sent-model"].tolist() == ["base", "averaged"]
    assert a.to_csv() == b.to_csv()  # every metric, to the last bit of its decimal form
    # each node's scores, but its node id (random per start of a federation)
    clients_a, clients_b = (pd.read_csv(f / "client-evaluation.csv").drop(columns="node") for f in (folder, simulated))
    assert len(clients_a) == 4 and clients_a.to_csv() == clients_b.to_csv()
    assert not (folder / "partition.csv").exists()  # the server holds no labels to count
    model_a = torch.load(folder / "final_model.pt", weights_only=True)
    model_b = torch.load(simulated / "final_model.pt", weights_only=True)
    assert model_a.keys() == model_b.keys()
    assert all(torch.equal(model_a[k], model_b[k]) for k in model_a)
    # Each process logged into the run's directory.
    assert {"superlink.log", "supernode-0.log", "supernode-2.log", "flwr.log"} <= {p.name for p in folder.iterdir()}
    # Every ClientApp process of a node was forked from its warm one (clients/warm_clientapp.py):
    # one per message, a query for its partition before round 1 and, each round it was
    # sampled in, its training and its evaluation.
    forks = [(folder / f"supernode-{k}.log").read_text().count("forked from the warm one") for k in range(3)]
    assert sum(forks) == 3 + 2 * 2 * 2 and min(forks) >= 1, forks
    assert not deployments.left, f"processes left running: {deployments.left}"


@pytest.mark.slow
def test_over_tls_only_registered_nodes_join_a_dead_and_a_frozen_one_fail_and_a_restarted_one_keeps_its_state(
        deployments):
    """One deployment, over TLS with SuperNode authentication, for three claims (each
    deployment costs a SuperLink and its nodes' start, and each broken node a wait of
    `round-timeout`: apart, about 25 s and 45 s more on 2 cores).

    The SuperLink admits the registered nodes only: an impostor claiming partition 0 with a
    key nobody registered is refused and gets no node id. Of the 3 registered SuperNodes,
    after round 1 one is killed (with its children) and one is stopped (SIGSTOP, with its
    children: frozen, not dead). Round 2 waits for them `round-timeout` seconds at most,
    counts each once, under its own partition on its own node, and goes on with the third;
    the killed one, started again as a new process under a new node id, takes its partition
    back in round 3 and trains there with its SCAFFOLD state of round 1 restored from its
    snapshot; the run completes, and the stopped processes are cleaned up with the rest (checked
    once all deployments have ended). (Flower's SuperLink may answer "Node Unavailable" for the dead one once
    it has missed its heartbeats: either way one failure under its partition; that reply's
    attribution is tested with Flower's own error message in tests/test_faults.py.)"""
    tls = deployments.over_tls.result()
    out, nodes, impostor = tls.out, tls.nodes, tls.impostor

    assert not tls.work_dir.exists()  # keys, certificates and FLWR_HOMEs are gone
    # Only the registered nodes are known to the SuperLink; the impostor never got an id.
    assert tls.listed >= {node.node_id for node in nodes[::2]} | {tls.restarted.node_id}
    assert impostor.node_id is None and impostor.process.returncode != 0
    assert "Failed to activate SuperNode" in impostor.log.read_text()
    assert "No SuperNode found with the given public key" in (out / "superlink.log").read_text()
    # The SuperLink served HTTPS and the CLI trusted the throw-away CA.
    assert f"Uvicorn running on https://127.0.0.1:{tls.port}" in (out / "superlink.log").read_text()
    entry = tls.cli_config["superlink"][tls.name]
    assert "insecure" not in entry and entry["root-certificates"].endswith("ca.crt")

    assert tls.summary["status"] == "completed"
    rows = pd.read_csv(out / "results.csv")
    assert tls.broken_after == 1 and rows["clients-ok"].tolist() == [3, 1, 2]
    assert rows["clients-failed"].tolist() == [0, 2, 1]
    dead, frozen = rows["failures"].iloc[1].split("; ")  # one entry each, in partition order
    assert dead.startswith(f"partition 1 (node {nodes[1].node_id}): ")
    assert frozen.startswith(f"partition 2 (node {nodes[2].node_id}): ")
    assert rows["round-seconds"].iloc[1] < ROUND_TIMEOUT + 3
    assert rows["failures"].iloc[2].startswith(f"partition 2 (node {nodes[2].node_id}): ")  # still frozen
    assert "partition 1: a new process; its client state of round 1 restored from" in tls.restarted.log.read_text()
    assert not deployments.left, f"processes left running: {deployments.left}"
