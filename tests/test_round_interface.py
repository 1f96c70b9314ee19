"""The interface between the round loop and the strategies (strategies/round_interface.py):
the loop and checkpoints ask every strategy the same questions, with no-op defaults."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.serverapp.strategy import FedAvgM as FlowerFedAvgM

from experiments.runtime.run_config import resolve_config
from strategies.averaging import ModelAveraging
from strategies.fedavg import FedAvg
from strategies.methods.strategy_builder import build_strategy
from strategies.round_interface import RoundStrategy

REPO = Path(__file__).resolve().parents[1]


def _record(value: float) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.full(2, value, np.float32))})


def test_the_round_loop_and_checkpoints_do_not_ask_what_kind_of_strategy_they_hold():
    for module in ("strategies/server_work.py", "strategies/checkpoint.py"):
        tree = ast.parse((REPO / module).read_text())
        calls = [node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                 and node.func.id in ("isinstance", "getattr", "hasattr") and node.args
                 and isinstance(node.args[0], ast.Name) and "strateg" in node.args[0].id]
        names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        assert not calls and "ModelAveraging" not in names, module


def test_a_plain_method_reports_the_sent_model_and_no_state_of_its_own():
    strategy = FedAvg()
    sent = _record(1.0)
    assert strategy.round_models(sent) == (sent, None) and strategy.final_arrays(sent) is sent
    assert not strategy.sends_average and strategy.prepare_round(1, sent, None) is None
    assert strategy.checkpoint_state() == {"base": {}, "method": {}}


def test_every_strategy_the_registry_builds_is_a_round_strategy():
    for strategy in ("fedavg", "fedadam", "scaffold", "mime", "fedswa", "fedalign"):
        for averaging in ("none", "ima"):
            config = resolve_config({"strategy": strategy, "averaging": averaging,
                                     **({"model": "resnet20-gn"} if strategy == "fedalign" else {}),
                                     **({"momentum": 0.0} if strategy == "mime" else {})})
            assert isinstance(build_strategy(config), RoundStrategy), (strategy, averaging)


def test_averaging_around_flowers_own_strategy_checkpoints_its_attributes_and_reports_the_average():
    averaging = ModelAveraging(FlowerFedAvgM(server_momentum=0.9), window=2, start_round=1, feedback=True)
    averaging.base.momentum_vector = {"w": np.ones(2)}
    averaging.averaged_arrays, averaging.base_arrays = _record(2.0), _record(3.0)
    sent = _record(1.0)
    assert averaging.round_models(sent) == (averaging.base_arrays, averaging.averaged_arrays)
    assert averaging.final_arrays(sent) is averaging.averaged_arrays and averaging.sends_average
    averaging.prepare_round(1, sent, None)  # Flower's FedAvgM has no exchange: nothing happens
    state = averaging.checkpoint_state()
    assert set(state) == {"base", "averaging"} and state["base"]["momentum_vector"]["w"].tolist() == [1.0, 1.0]
    restored = ModelAveraging(FlowerFedAvgM(server_momentum=0.9), window=2, start_round=1, feedback=True)
    restored.load_checkpoint_state(state)
    assert restored.base.momentum_vector["w"].tolist() == [1.0, 1.0]
    assert restored.averaged_arrays["w"].numpy().tolist() == [2.0, 2.0]


def test_a_wrapper_offers_the_round_state_of_what_it_wraps_and_nothing_unstated():
    """The averaging component and server-side DP state what they take from the strategy they
    wrap (WrappingStrategy): the cohort's binding and the round's bookkeeping; anything else
    of the wrapped strategy is not theirs (it was, silently, through ``__getattr__``)."""
    from strategies.privacy import ServerSideDP

    base = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=0, min_available_nodes=0)
    averaging = ModelAveraging(base, window=2, start_round=1, feedback=True)
    private = ServerSideDP(averaging, noise_multiplier=0.0, clipping_norm=1.0, num_sampled_clients=2, seed=0)
    private.bind_partitions({100: 0, 101: 1}, 2, seed=0)
    assert base.partition_of_node == {100: 0, 101: 1} and base.cohort_size == 2
    base.round_status, base.round_clients = "skipped: no replies", {"sampled": 2.0}
    assert (private.round_status, averaging.round_clients) == (averaging.round_status, base.round_clients) \
        == ("skipped: no replies", {"sampled": 2.0})
    # DP adds the ε spent so far (NaN: this wrapper has no accountant)
    assert private.round_clients.keys() == {"sampled", "dp-epsilon"} and private.round_clients["sampled"] == 2.0
    assert not hasattr(averaging, "partition_of_node") and not hasattr(private, "cohort_size")
