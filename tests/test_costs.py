"""The cost table (experiments/costs.py) on a tiny CPU setup: FLOPs split into forward and
backward, parameters held per method, timings, and the command line's input checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from clients.local_round import LocalRound
from clients.models import build_model
from experiments import costs
from experiments.measurement import method_costs
from tests.fakes import NO_CLIENT

MODEL, SHAPE, CLASSES, BATCH, STEPS = "resnet20-gn", (3, 16, 16), 10, 8, 2
METHODS = ["fedprox", "scaffold", "moon", "fedsam", "gradaug-n1", "gradaug-n2", "fedalign"]


@pytest.fixture(scope="module")
def table():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # steadier timings on a busy machine
    try:
        return method_costs.run_costs(METHODS, MODEL, SHAPE, CLASSES, BATCH, STEPS, "cpu")
    finally:
        torch.set_num_threads(threads)


def model_parameters() -> int:
    return sum(p.numel() for p in build_model(MODEL, SHAPE, CLASSES).parameters())


def test_fedavg_is_measured_first_and_every_method_has_a_row(table):
    assert list(table.index) == ["fedavg", *METHODS]
    assert table.loc["fedavg", "fwd ×"] == 1.0 and table.loc["fedavg", "time ×"] == 1.0


def test_forward_flops_per_method(table):
    fwd = table["fwd GFLOPs/sample"]
    assert fwd["fedavg"] < fwd["fedalign"] < 1.2 * fwd["fedavg"]  # one slim pass of the last stage
    assert fwd["fedavg"] < fwd["gradaug-n1"] < fwd["gradaug-n2"]
    assert fwd["moon"] == pytest.approx(3 * fwd["fedavg"], rel=0.05)  # three models' forward passes
    assert fwd["fedsam"] == pytest.approx(2 * fwd["fedavg"], rel=1e-9)  # forward at w and at w + ε
    for method in ("fedprox", "scaffold"):  # gradient hooks add no matrix products
        assert fwd[method] == fwd["fedavg"]


def test_forward_and_backward_are_told_apart(table):
    train, fwd = table["train GFLOPs/sample"], table["fwd GFLOPs/sample"]
    # Backward of a conv/linear layer costs twice its forward (input and weight gradients),
    # less the stem's input gradient, which is not needed.
    assert 2.5 * fwd["fedavg"] < train["fedavg"] < 3.0 * fwd["fedavg"]
    assert train["fedsam"] == pytest.approx(2 * train["fedavg"], rel=1e-9)  # two full steps' worth
    # MOON's global and previous models run under no_grad: forward only.
    assert train["moon"] - fwd["moon"] == pytest.approx(train["fedavg"] - fwd["fedavg"], rel=0.01)


def test_parameters_held(table):
    held = table["params held (M)"] * 1e6
    n = model_parameters()
    assert held["fedavg"] == pytest.approx(n)
    assert held["fedprox"] == pytest.approx(2 * n)  # the anchor w^t, in the hook's closure
    assert held["moon"] == pytest.approx(3 * n)  # global and previous model
    assert held["fedalign"] == pytest.approx(n)
    assert held["gradaug-n2"] == pytest.approx(n)
    assert held["scaffold"] == pytest.approx(5 * n)  # c, c_i, c − c_i and w^t besides the model
    assert (table["params ×"] == held / n).all()


def test_timings_positive_and_memory_not_made_up_on_cpu(table):
    assert (table["s/step"] > 0).all()
    assert table["peak MiB"].isna().all()
    assert "n/a" in method_costs.format_table(table)


def test_an_untimed_measurement_counts_the_same_flops_and_parameters_in_its_counted_steps_only(table, monkeypatch):
    """What `reproduce` measures for its MFLOPs and parameter cells (no time cell reads a
    step's seconds): the warm-up and timed steps are left out, the numbers are the same."""
    config = method_costs.method_config("fedprox", MODEL, SHAPE, BATCH, "cpu", {})
    steps_run = []
    train = LocalRound.train

    def counted(self, *args, **kwargs):
        steps_run.append(self.round_config[method_costs.protocol.LOCAL_STEPS])
        return train(self, *args, **kwargs)

    monkeypatch.setattr(LocalRound, "train", counted)
    cost = method_costs.measure("fedprox", config, MODEL, SHAPE, CLASSES, BATCH, STEPS, torch.device("cpu"), timed=False)
    assert steps_run == [STEPS]  # only the counted local round
    assert cost.seconds_per_step == 0.0
    assert cost.forward_flops / 1e9 == table.loc["fedprox", "fwd GFLOPs/sample"]
    assert cost.train_flops / 1e9 == table.loc["fedprox", "train GFLOPs/sample"]
    assert cost.held_elements / 1e6 == table.loc["fedprox", "params held (M)"]


def test_held_elements_counts_closures_and_shared_storage_once():
    model = build_model(MODEL, SHAPE, CLASSES)
    anchors = [p.detach().clone() for p in model.parameters()]
    round_ = LocalRound.__new__(LocalRound)
    # A hook closure, a shared tensor seen twice, and a module that is part of the model.
    round_.__dict__.update(hooks=[lambda params: anchors], again=anchors[0], stages=model.stages)
    own, held = method_costs.held_elements(model, round_)
    assert own == model_parameters() and held == 2 * own


def test_training_message_comes_from_the_strategy():
    identity = TaskIdentity._run_id
    config = method_costs.method_config("gradaug-n1", MODEL, SHAPE, BATCH, "cpu", {})
    content = method_costs.training_content(config, ArrayRecord(build_model(MODEL, SHAPE, CLASSES).state_dict()))
    assert content["config"]["objective"] == "gradaug" and content["config"]["gradaug-subnets"] == 1
    assert content["config"]["batch-size"] == BATCH
    scaffold = method_costs.training_content(method_costs.method_config("scaffold", MODEL, SHAPE, BATCH, "cpu", {}),
                                      ArrayRecord(build_model(MODEL, SHAPE, CLASSES).state_dict()))
    assert "scaffold-control" in scaffold
    LocalRound(build_model(MODEL, SHAPE, CLASSES), scaffold, RecordDict(), np.random.default_rng(0), NO_CLIENT)
    assert TaskIdentity._run_id == identity  # the server identity is restored


@pytest.mark.parametrize("argv, option", [
    (["--methods", "fedavg,bogus"], "--methods"),
    (["--methods", "gradaug-n0"], "--methods"),
    (["--input-shape", "3,x,32"], "--input-shape"),
    (["--model", "cifar-cnn", "--input-shape", "1,28,28"], "--input-shape"),
    (["--model", "cifar-cnn", "--methods", "fedalign"], "model"),
    (["--steps", "0"], "--steps"),
    (["--set", "prox-mu=-1"], "prox-mu"),
])
def test_cli_rejects_bad_input_before_any_work(argv, option, capsys):
    assert costs.main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and option in error and "allowed" in error
