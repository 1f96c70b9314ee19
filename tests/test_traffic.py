"""What each method sends and receives per client and round (experiments.costs's traffic
columns, docs/methods.md's traffic column): hand-computed on the digits' MLP for the methods
that send more than their model, and, for every declared method, equal to what a real round
of its strategy through the ClientApp's handlers on real data counts in results.csv."""

from __future__ import annotations

import pytest
import torch
from flwr.app import Array, ArrayRecord, Message, MessageType, RecordDict

from clients import protocol
from clients.models import build_model, resolve_model_name
from experiments.measurement.in_process_grid import InProcessGrid
from experiments.measurement.method_traffic import measure_traffic
from experiments.runtime.run_config import resolve_config
from partitions import load_dataset
from strategies.exchange import array_bytes
from strategies.methods.registry import METHODS_BY_NAME
from strategies.server_work import train_rounds
from tests.test_compositions import Rows

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py

SHAPE, CLASSES = (1, 8, 8), 10
# Three clients of the 8×8 digits, all in each of two rounds, nothing failing.
REAL_ROUNDS = {
    "dataset": "digits", "num-clients": 3, "participation": 1.0, "num-rounds": 2, "local-epochs": 1, "batch-size": 64,
    "momentum": 0.0, "min-partition-size": 1, "checkpoint-every": 0, "torch-threads": 1, "server-torch-threads": 1, "device": "cpu",
}


def config_of(method: str) -> dict:
    model = {"model": "resnet20-gn"} if METHODS_BY_NAME[method].model_needs == "slimmable-residual" else {}
    return resolve_config({}, {**REAL_ROUNDS, **model, "strategy": method})


def bytes_of(arrays: dict[str, torch.Tensor]) -> int:
    """The bytes a message counts for these arrays (np.save's headers included)."""
    record = ArrayRecord({key: Array(value.numpy()) for key, value in arrays.items()})
    return array_bytes(Message(RecordDict({protocol.MODEL_RECORD: record}), dst_node_id=1, message_type=MessageType.TRAIN))


def test_the_traffic_of_a_round_is_the_model_each_way_and_what_the_method_sends_beside_it():
    model = build_model(resolve_model_name("auto", "digits"), SHAPE, CLASSES)
    weights = bytes_of(model.state_dict())  # the MLP's state is its float parameters: a control has the same arrays
    traffic = {m: measure_traffic(config_of(m), resolve_model_name("auto", "digits"), SHAPE, CLASSES)
               for m in ("fedavg", "scaffold", "mime", "mimelite", "fedmoswa", "fedfa")}
    assert {m: (t.down, t.up) for m, t in traffic.items() if m != "fedfa"} == {
        "fedavg": (weights, weights),
        "scaffold": (2 * weights, 2 * weights),  # w and c down; w and Δc_i up
        "mime": (4 * weights, 2 * weights),  # the gradient query's w; then w, the momentum m and c; ∇f_i and w up
        "mimelite": (3 * weights, 2 * weights),  # the same without c
        "fedmoswa": (2 * weights, 3 * weights),  # w and c down; w, Δc_i and the new c_i up
    }
    assert all(t.model == weights for t in traffic.values())
    # FedFA: the model and its anchors both ways, one per class of the classifier's input width.
    features = model.state_dict()[next(k for k in reversed(model.state_dict()) if k.endswith("weight"))].shape[1]
    anchors = bytes_of({"anchors": torch.zeros(CLASSES, features)})
    fedfa = traffic["fedfa"]
    assert fedfa.down == fedfa.up and weights < fedfa.up <= weights + anchors + 256


@pytest.mark.parametrize("method", list(METHODS_BY_NAME))
def test_the_measured_traffic_is_what_a_real_round_of_the_method_counts(method, tmp_path):
    config = config_of(method)
    rows = Rows(tmp_path)
    grid = InProcessGrid(config, config["num-clients"])
    train_rounds(grid, config, rows, None, load_dataset("digits", "", True), torch.device("cpu"))
    assert [row["clients-ok"] for row in rows] == [3, 3]
    traffic = measure_traffic(config, resolve_model_name(config["model"], "digits"), SHAPE, CLASSES)
    assert (rows[1]["bytes-sent"], rows[1]["bytes-received"]) == (3 * traffic.down, 3 * traffic.up)
    # what one client received and sent: the totals over the 3 sampled
    assert (rows[1]["bytes-sent-per-client"], rows[1]["bytes-received-per-client"]) == (traffic.down, traffic.up)
