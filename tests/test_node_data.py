"""A node's own data (partitions/node_data.py): the formats a user has, read into the arrays
Basin trains on; a partition written to one folder per node (experiments.write_partitions)
and read back by the nodes gives the simulation's bits; bad data is the node's one line."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from flwr.app import MessageType
from PIL import Image

from clients import protocol
from clients.data import client_tensors, node_tensors
from clients.models import build_run_model
from clients.training import evaluate
from experiments.measurement.in_process_grid import CLIENT_APP_HANDLERS, InProcessGrid
from experiments.runtime.run_config import resolve_config
from experiments.write_partitions import write_partitions
from partitions import load_dataset
from partitions.node_data import NodeDataError, load_node_data
from strategies import server_work
from strategies.model_store import load_round_models
from strategies.server_work import train_rounds
from tests.test_compositions import Rows

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py

SMALL = {"dataset": "digits", "num-clients": 4, "alpha": 0.3, "participation": 0.5, "num-rounds": 2,
         "local-epochs": 1, "client-evaluation": 0.25, "checkpoint-every": 0, "save-models-every": 1}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """SMALL's partition, written to one folder per node."""
    out = tmp_path_factory.mktemp("nodes")
    return resolve_config({}, SMALL), write_partitions(resolve_config({}, SMALL), out)


def test_each_written_folder_gives_its_partitions_tensors_bit_for_bit(written):
    config, folders = written
    items = tuple(sorted(config.items()))
    assert [f.name for f in folders] == ["node-0", "node-1", "node-2", "node-3"]
    assert (folders[0].parent / "partition.csv").is_file()
    for partition_id, folder in enumerate(folders):
        simulated = client_tensors(items, partition_id, 4, "cpu")
        own, num_classes = node_tensors(str(folder), items, partition_id, "cpu")
        assert num_classes == 10
        for theirs, ours in zip(simulated, own, strict=True):
            assert theirs.dtype == ours.dtype and theirs.shape == ours.shape and torch.equal(theirs, ours)


FEDPROX_IMA = {"strategy": "fedprox", "averaging": "ima", "window": 2, "avg-start": 2}


def test_a_text_sets_partition_is_written_as_strings_that_give_its_ids_again(miniature_hub, tmp_path):
    """Next-character text (a Shakespeare-like set, one node per speaking role): each node's
    folder holds its snippets as strings, read back to the partition's ids and targets exactly."""
    config = resolve_config({}, {"dataset": f"hf:{miniature_hub['shakespeare']}", "model": "char-lstm",
                                 "partition": "natural", "num-clients": 4, "client-evaluation": 0.25})
    folders = write_partitions(config, tmp_path)
    items = tuple(sorted(config.items()))
    for partition_id, folder in enumerate(folders):
        simulated = client_tensors(items, partition_id, 4, "cpu")
        own, num_classes = node_tensors(str(folder), items, partition_id, "cpu")
        assert num_classes == load_dataset(config["dataset"]).num_classes
        for theirs, ours in zip(simulated, own, strict=True):
            assert theirs.dtype == ours.dtype and theirs.shape == ours.shape and torch.equal(theirs, ours)
    assert (tmp_path / "partition.csv").is_file()
    # characters outside the vocabulary, an empty snippet, one longer than a sequence
    from partitions.text import decode_text, encode_text

    ids = encode_text(["Ab é€", "", "x" * 100, "end"], ["c", "x", "é", ""])
    again = encode_text(*decode_text(*ids))
    assert all(np.array_equal(a, b) for a, b in zip(ids, again, strict=True))


@pytest.mark.parametrize("keys", [FEDPROX_IMA, {"strategy": "scaffold", "momentum": 0.0},
                                  {"strategy": "scaffold", "momentum": 0.0, "evaluation": "federated"}],
                         ids=["fedprox+ima", "scaffold", "scaffold-federated-evaluation"])
def test_nodes_on_their_own_folders_train_to_the_simulations_bits(written, tmp_path, keys):
    """FedProx + IMA, and SCAFFOLD with its client state (scored centrally, and by the nodes
    themselves), through the round loop and the ClientApp's handlers: each node reads its own
    folder (node config data-path, its partition id from the folder's basin-node.json), and
    every round's row and model are the simulation's."""
    config, folders = written
    config = resolve_config({}, {**SMALL, **keys})
    data = load_dataset("digits", "", True) if config["evaluation"] == "central" else None
    runs = {}
    for name in ("simulated", "own-data"):
        grid = InProcessGrid(config, 4)
        if name == "own-data":
            for node_id, context in grid.contexts.items():
                context.node_config.clear()
                context.node_config[protocol.NODE_DATA_PATH] = str(folders[node_id - 100])
        directory = tmp_path / name
        directory.mkdir()
        rows = Rows(directory)
        train_rounds(grid, config, rows, None, data, torch.device("cpu"))
        runs[name] = (rows, [load_round_models(directory, r) for r in (1, 2)])
    timing = ("round-seconds", "train-seconds", "eval-seconds", "client-seconds")
    assert runs["own-data"][0].client_rows == runs["simulated"][0].client_rows  # each node's held-out score
    for ours, theirs in zip(runs["own-data"][0], runs["simulated"][0], strict=True):
        kept = [k for k in theirs if k not in timing]
        assert pd.Series({k: ours[k] for k in kept}).equals(pd.Series({k: theirs[k] for k in kept}))  # NaN = NaN
    for ours, theirs in zip(runs["own-data"][1], runs["simulated"][1], strict=True):
        for kind in ("base", "averaged"):
            if theirs[kind] is not None:
                assert all(torch.equal(ours[kind][k], theirs[kind][k]) for k in theirs[kind])


def test_named_nodes_without_partition_ids_are_ranked_by_name_and_train_to_the_simulations_bits(written, tmp_path):
    """Nodes known by a node-name only (their folders' basin-node.json without a partition id,
    node ids in another order than the names): the sorted names are partitions 0..3, each
    message carries the node's, and the run is the simulation's, row for row and model for model."""
    import json
    import shutil

    config, folders = written
    config = resolve_config({}, {**SMALL, "strategy": "scaffold", "momentum": 0.0})
    data = load_dataset("digits", "", True)
    names = ["a-clinic", "b-hospital", "c-lab", "d-phone"]  # partition k's folder goes to the k-th name
    runs = {}
    for name in ("simulated", "named"):
        grid = InProcessGrid(config, 4)
        if name == "named":
            for node_id, context in grid.contexts.items():
                k = 3 - (node_id - 100)  # node 100 holds partition 3's data, …
                folder = shutil.copytree(folders[k], tmp_path / "named-data" / names[k])
                described = json.loads((folder / "basin-node.json").read_text())
                del described["partition-id"], described["num-partitions"]
                (folder / "basin-node.json").write_text(json.dumps(described))
                context.node_config.clear()
                context.node_config.update({protocol.NODE_DATA_PATH: str(folder), protocol.NODE_NAME: names[k]})
        directory = tmp_path / name
        directory.mkdir()
        rows = Rows(directory)
        train_rounds(grid, config, rows, None, data, torch.device("cpu"))
        runs[name] = (rows, load_round_models(directory, 2))
    timing = ("round-seconds", "train-seconds", "eval-seconds", "client-seconds", "failures")
    for ours, theirs in zip(runs["named"][0], runs["simulated"][0], strict=True):
        kept = [k for k in theirs if k not in timing]
        assert pd.Series({k: ours[k] for k in kept}).equals(pd.Series({k: theirs[k] for k in kept}))
    assert [(c["partition"], c["node"]) for c in runs["named"][0].client_rows][:2] == [
        (c["partition"], 103 - c["partition"]) for c in runs["named"][0].client_rows][:2]
    ours, theirs = runs["named"][1]["base"], runs["simulated"][1]["base"]
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_federated_evaluation_scores_the_rounds_models_on_the_nodes_and_the_server_reads_no_data(
        written, tmp_path, monkeypatch):
    """evaluation = federated: the ServerApp reads no data set (its loader and the partition
    statistics raise here), and each round's accuracy is the example-weighted mean, over the
    round's sampled nodes, of the reported model (IMA's average once there is one) scored on
    each node's own held-out split, recomputed here from the saved models."""
    config, folders = written
    config = resolve_config({}, {**SMALL, **FEDPROX_IMA, "evaluation": "federated"})
    grid = InProcessGrid(config, 4)
    for node_id, context in grid.contexts.items():
        context.node_config.clear()
        context.node_config[protocol.NODE_DATA_PATH] = str(folders[node_id - 100])

    def server_read_data(*args, **kwargs):
        raise AssertionError("the server read a data set")

    monkeypatch.setattr(server_work, "load_dataset", server_read_data)
    monkeypatch.setattr(server_work, "partition_statistics", server_read_data)
    rows = Rows(tmp_path)
    server_work.run(grid, config, rows)
    assert rows.described["evaluation"]["kind"] == "federated"

    items = tuple(sorted(config.items()))
    held_out = {p: node_tensors(str(folder), items, p, "cpu")[0][2:] for p, folder in enumerate(folders)}
    model = build_run_model(config, (1, 8, 8), 10)
    for row in rows:
        saved = load_round_models(tmp_path, row["round"])
        reported = "averaged" if saved["averaged"] is not None else "base"
        model.load_state_dict(saved[reported])
        clients = [c for c in rows.client_rows if c["round"] == row["round"]]
        assert [c["partition"] for c in clients] == sorted(saved["clients"])  # the round's cohort, in order
        scores = [(len(held_out[c["partition"]][1]), *evaluate(model, *held_out[c["partition"]])) for c in clients]
        total = sum(n for n, _, _ in scores)
        assert row["test-accuracy"] == pytest.approx(sum(n * accuracy for n, _, accuracy in scores) / total, abs=1e-12)
        assert row["test-loss"] == pytest.approx(sum(n * loss for n, loss, _ in scores) / total, rel=1e-6)
        assert row["clients-evaluated"] == 2 and row["sent-model"] == ("averaged" if row["round"] == 2 else "base")
    assert rows[1]["averaged-accuracy"] == rows[1]["test-accuracy"] != rows[1]["base-accuracy"]


def test_a_node_restarted_mid_run_continues_with_the_client_state_on_its_disk(written, tmp_path):
    """SCAFFOLD's c_i kept on each node's disk (node config client-state-dir): a node whose
    process restarts before round 3 (its context.state empty) restores its state of round 2
    from there and trains to the bits of the run where it never restarted."""
    config, folders = written
    config = resolve_config({}, {**SMALL, "strategy": "scaffold", "momentum": 0.0, "participation": 1.0,
                                 "num-rounds": 3, "checkpoint-every": 2})
    data = load_dataset("digits", "", True)
    restarted: list[int] = []

    def train(msg, context):
        if context.node_id == 101 and int(msg.content["config"]["server-round"]) == 3:
            for key in list(context.state):  # a new process: nothing in memory
                del context.state[key]
            restarted.append(3)
        return CLIENT_APP_HANDLERS[MessageType.TRAIN](msg, context)

    runs = {}
    for name, handlers in (("uninterrupted", CLIENT_APP_HANDLERS), ("restarted", {**CLIENT_APP_HANDLERS, MessageType.TRAIN: train})):
        grid = InProcessGrid(config, 4, handlers)
        for node_id, context in grid.contexts.items():
            context.node_config.clear()
            context.node_config[protocol.NODE_DATA_PATH] = str(folders[node_id - 100])
            context.node_config[protocol.NODE_CLIENT_STATE_DIR] = str(tmp_path / name / f"node-{node_id - 100}-state")
        directory = tmp_path / name / "run"
        directory.mkdir(parents=True)
        rows = Rows(directory)
        train_rounds(grid, config, rows, None, data, torch.device("cpu"))
        runs[name] = (rows, load_round_models(directory, 3))
    assert restarted == [3]
    assert not runs["restarted"][0][2]["failures"]
    kept = ("test-accuracy", "test-loss", "train-loss", "client-state-norm")
    assert [[row[k] for k in kept] for row in runs["restarted"][0]] == [[row[k] for k in kept] for row in runs["uninterrupted"][0]]
    ours, theirs = runs["restarted"][1]["base"], runs["uninterrupted"][1]["base"]
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_a_node_that_lost_its_client_state_stops_the_run_in_one_line_naming_it(written, tmp_path):
    """The same restart, its client-state-dir gone with it: the node says it trained in round 2
    and holds no state of it, and the run stops with that line (its checkpoint kept)."""
    import shutil

    from strategies.reply_screening import ClientStateLost

    config, folders = written
    config = resolve_config({}, {**SMALL, "strategy": "scaffold", "momentum": 0.0, "participation": 1.0,
                                 "num-rounds": 3, "checkpoint-every": 2})

    def train(msg, context):
        if context.node_id == 101 and int(msg.content["config"]["server-round"]) == 3:
            for key in list(context.state):
                del context.state[key]
            shutil.rmtree(context.node_config[protocol.NODE_CLIENT_STATE_DIR])
        return CLIENT_APP_HANDLERS[MessageType.TRAIN](msg, context)

    grid = InProcessGrid(config, 4, {**CLIENT_APP_HANDLERS, MessageType.TRAIN: train})
    for node_id, context in grid.contexts.items():
        context.node_config.clear()
        context.node_config[protocol.NODE_DATA_PATH] = str(folders[node_id - 100])
        context.node_config[protocol.NODE_CLIENT_STATE_DIR] = str(tmp_path / f"node-{node_id - 100}-state")
    rows = Rows(tmp_path)
    with pytest.raises(ClientStateLost, match=r"^round 3: partition 1 \(node 101\): client error: ClientStateLost: "
                                              r"partition 1 trained in round 2, but neither its memory nor .*node-1-state"):
        train_rounds(grid, config, rows, None, load_dataset("digits", "", True), torch.device("cpu"))
    assert len(rows) == 2


def _image(path, value: int, size=(8, 8)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full(size, value, dtype=np.uint8)).save(path)


def test_a_class_per_folder_image_folder_with_its_own_test_split(tmp_path):
    for i in range(3):
        _image(tmp_path / "train" / "2" / f"a{i}.png", 10 * i)
        _image(tmp_path / "train" / "7" / f"b{i}.png", 100)
    _image(tmp_path / "test" / "7" / "c.png", 5)
    node = load_node_data(tmp_path)
    assert node.x_train.shape == (6, 1, 8, 8) and node.x_train.dtype == np.uint8
    assert node.y_train.tolist() == [2, 2, 2, 7, 7, 7] and node.x_train[1].max() == 10  # labels: the folders' names
    assert node.y_test.tolist() == [7] and node.max_value == 255


def test_parquet_and_csv_files_of_images_and_labels(tmp_path):
    import datasets

    images = [np.full((8, 8, 3), v, dtype=np.uint8) for v in (1, 2, 3)]
    table = datasets.Dataset.from_dict({"image": images, "label": [0, 4, 9]},
                                       features=datasets.Features({"image": datasets.Image(),
                                                                   "label": datasets.Value("int64")}))
    table.to_parquet(str(tmp_path / "node.parquet"))
    node = load_node_data(tmp_path / "node.parquet")
    assert node.x_train.shape == (3, 3, 8, 8) and node.y_train.tolist() == [0, 4, 9] and node.x_train[2].max() == 3
    for i, value in enumerate((7, 8)):
        _image(tmp_path / "pictures" / f"{i}.png", value)
    pd.DataFrame({"image": ["pictures/0.png", "pictures/1.png"], "label": [3, 1]}).to_csv(tmp_path / "node.csv",
                                                                                         index=False)
    node = load_node_data(tmp_path / "node.csv")  # image paths beside the file
    assert node.x_train.shape == (2, 1, 8, 8) and node.y_train.tolist() == [3, 1] and node.x_train[1].max() == 8


def test_bad_node_data_is_one_line_naming_the_path_and_what_is_wrong(tmp_path):
    cases = {}
    cases["missing"] = (tmp_path / "nowhere", "no such file or folder")
    (tmp_path / "empty").mkdir()
    cases["empty"] = (tmp_path / "empty", "the folder is empty")
    _image(tmp_path / "named" / "cats" / "a.png", 1)
    cases["named"] = (tmp_path / "named", "class folder(s) cats are not class indices")
    (tmp_path / "broken" / "0").mkdir(parents=True)
    (tmp_path / "broken" / "0" / "a.png").write_bytes(b"not a png")
    cases["broken"] = (tmp_path / "broken", "cannot be read: ")
    pd.DataFrame({"pixels_wrong": [1], "label": [0]}).to_csv(tmp_path / "columns.csv", index=False)
    cases["columns"] = (tmp_path / "columns.csv", "needs an image column")
    for name, (path, phrase) in cases.items():
        with pytest.raises(NodeDataError) as refused:
            load_node_data(path)
        line = str(refused.value)
        assert line.startswith(f"node data {path}") and phrase in line and "\n" not in line, (name, line)


def test_a_label_beyond_the_runs_classes_is_the_nodes_error(tmp_path):
    for i in range(2):
        _image(tmp_path / "12" / f"{i}.png", i)
    with pytest.raises(NodeDataError, match=r"its training split holds label 12, but the run has 10 classes"):
        load_node_data(tmp_path).check_fits(10, (1, 8, 8))
    with pytest.raises(NodeDataError, match=r"its inputs have shape \(1, 8, 8\), the run's model takes \(3, 32, 32\)"):
        load_node_data(tmp_path).check_fits(20, (3, 32, 32))


def test_a_node_whose_data_does_not_fit_is_refused_before_round_1_and_one_that_cannot_read_it_fails_its_rounds(
        written, tmp_path):
    """Discovery asks every node what it holds: labels beyond the run's classes stop the run in
    one line naming the node; data the node cannot read is that node's failure in every round it
    is sampled, named in the summary, and the run goes on with the others."""
    from strategies.discovery import NodeDiscoveryError

    config, folders = written
    config = resolve_config({}, {**SMALL, "client-evaluation": 0.0, "participation": 1.0, "min-replies": 3})
    data = load_dataset("digits", "", True)

    def grid_with(node_3_path):
        grid = InProcessGrid(config, 4)
        for node_id, context in grid.contexts.items():
            context.node_config[protocol.NODE_DATA_PATH] = str(folders[node_id - 100] if node_id != 103 else node_3_path)
        return grid

    for i in range(2):
        _image(tmp_path / "misfit" / "12" / f"{i}.png", i)
    with pytest.raises(NodeDiscoveryError, match=r"^node 103: holds label 12 in its 2 examples, but the run has 10 "
                                                  r"classes \(labels 0\.\.9\)$"):
        train_rounds(grid_with(tmp_path / "misfit"), config, Rows(tmp_path), None, data, torch.device("cpu"))
    rows = Rows(tmp_path)
    train_rounds(grid_with(tmp_path / "gone"), config, rows, None, data, torch.device("cpu"))
    for row in rows:
        assert (row["clients-ok"], row["clients-failed"], row["round-status"]) == (3, 1, "aggregated")
        assert row["failures"].startswith(f"partition 3 (node 103): client error: NodeDataError: node data "
                                          f"{tmp_path / 'gone'}: no such file or folder")
    assert rows.described["node-data-problems"] == {
        "partition 3": f"node data {tmp_path / 'gone'}: no such file or folder"}  # the summary names the node
