"""FedFA (Zhou, Zhang, Tsang, IEEE TMC 2023): the feature-anchor loss, the classifier's calibration, the
anchors' EMA and the server's anchors and weighted average."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from torch import nn

from clients import protocol
from strategies.checkpoint import load_checkpoint, save_checkpoint
from tests.fakes import COHORT, FakeGrid
from tests.tiny_rounds import NODES, bound

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py


class TinyFeatureModel(nn.Module):
    """h = features(x) (d = 2), logits = classifier(h) (C = 3)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Linear(2, 2, bias=False)
        self.classifier = nn.Linear(2, 3)
        with torch.no_grad():
            self.features.weight.copy_(torch.tensor([[1.0, 0.0], [0.5, 1.0]]))
            self.classifier.weight.copy_(torch.tensor([[0.2, -0.1], [0.0, 0.3], [-0.2, 0.1]]))
            self.classifier.bias.zero_()

    def represent(self, x):
        return self.features(x)

    def forward(self, x):
        return self.classifier(self.represent(x))


ANCHORS = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])


def test_fedfa_anchor_loss_by_hand():
    from clients.objectives.fedfa import FeatureAnchors

    model = TinyFeatureModel()
    x, y = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]), torch.tensor([0, 0, 2])
    objective = FeatureAnchors(model, ANCHORS, lam=0.1, rho=0.5, calibrate=False)
    loss = objective.backward(model, x, y)
    # h = [1, 0.5], [0, 2], [1, 1.5]; class 0 twice (n_0 = 2), class 2 once:
    # ‖[0, 0.5]‖²/2 + ‖[−1, 2]‖²/2 + ‖[0.5, 1]‖²/1 = 0.125 + 2.5 + 1.25; L_A = 0.1·3.875/3 (C = 3, not the 2 present)
    ce = nn.functional.cross_entropy(model(x), y)
    assert loss.item() == pytest.approx(ce.item() + 0.1 * 3.875 / 3, rel=1e-6)
    plain = FeatureAnchors(TinyFeatureModel(), ANCHORS, lam=0.1, rho=0.5, anchor_loss=False, calibrate=False)
    assert plain.backward(plain_model := TinyFeatureModel(), x, y).item() == pytest.approx(ce.item(), rel=1e-6)
    assert plain_model.features.weight.grad is not None


def test_fedfa_calibration_is_one_adam_step_of_the_classifier_on_the_anchors():
    from clients.objectives.fedfa import FeatureAnchors

    model = TinyFeatureModel()
    objective = FeatureAnchors(model, ANCHORS, lam=0.1, rho=0.5)
    features_before = model.features.weight.detach().clone()
    weight, bias = model.classifier.weight.detach().clone().requires_grad_(), model.classifier.bias.detach().clone().requires_grad_()
    grads = torch.autograd.grad(nn.functional.cross_entropy(ANCHORS @ weight.T + bias, torch.arange(3)), [weight, bias])
    objective.after_step(model)
    # Adam's first step with PyTorch's defaults: −lr·ĝ/(√v̂ + ε) = −1e-3·g/(|g| + 1e-8)
    for param, start, g in zip(model.classifier.parameters(), (weight, bias), grads):
        torch.testing.assert_close(param.detach(), start.detach() - 1e-3 * g / (g.abs() + 1e-8))
    torch.testing.assert_close(model.features.weight.detach(), features_before)  # the features are not calibrated


def test_fedfa_anchor_ema_over_an_epochs_batches():
    from clients.objectives.fedfa import FeatureAnchors

    model = TinyFeatureModel()
    with torch.no_grad():
        model.features.weight.copy_(torch.eye(2))  # h = x
    objective = FeatureAnchors(model, ANCHORS, lam=0.0, rho=0.5, calibrate=False)
    objective.backward(model, torch.tensor([[2.0, 0.0], [4.0, 0.0]]), torch.tensor([0, 0]))  # class 0 mean [3, 0]
    objective.backward(model, torch.tensor([[0.0, 2.0]]), torch.tensor([1]))  # class 1 mean [0, 2]
    objective.end_epoch()
    # m_c = s_c/(2 batches): class 0 [1.5, 0], class 1 [0, 1]; class 2 unseen keeps its anchor.
    expected = torch.tensor([[0.5 * 1 + 0.5 * 1.5, 0.0], [0.0, 0.5 * 1 + 0.5 * 1.0], [0.5, 0.5]])
    torch.testing.assert_close(objective.reply_tensors()["anchors"], expected)
    torch.testing.assert_close(objective.anchors, ANCHORS)  # A itself is frozen for the round


def test_fedfa_refuses_a_model_without_features_and_a_linear_head():
    from clients.objectives.fedfa import FeatureAnchors

    with pytest.raises(ValueError, match="represent"):
        FeatureAnchors(nn.Sequential(nn.Linear(2, 3)), ANCHORS, lam=0.1, rho=0.5)


def test_fedfa_server_anchors_schedule_and_weighted_average(tmp_path):
    from strategies.fedfa import FedFa, initial_anchors, round_schedule

    one_hot = initial_anchors(3, 5, seed=0)
    assert one_hot.shape == (3, 5) and set(one_hot.sum(axis=1)) == {1.0} and len({tuple(r) for r in one_hot}) == 3
    gaussian = initial_anchors(6, 4, seed=0)
    np.testing.assert_allclose(np.linalg.norm(gaussian, axis=1), 1.0, rtol=1e-6)
    assert [round_schedule("paper", t, 8) for t in (1, 2)] == [(True, True)] * 2
    assert [round_schedule("fedfa-ima", t, 8) for t in (1, 2, 3)] == [(False, False), (True, False), (True, True)]

    strategy = bound(FedFa(lam=0.1, rho=0.5, variant="fedfa-ima", num_rounds=8, **COHORT))
    sent = ArrayRecord({"classifier.weight": Array(np.zeros((3, 2), np.float32)), "classifier.bias": Array(np.zeros(3, np.float32))})
    messages = list(strategy.configure_train(1, sent, ConfigRecord({"lr": 0.1}), FakeGrid(NODES)))
    config = messages[0].content["config"]
    assert (config[protocol.OBJECTIVE], config[protocol.FEDFA_ANCHOR_LOSS], config[protocol.FEDFA_CALIBRATE]) == ("fedfa", False, False)
    np.testing.assert_array_equal(messages[0].content[protocol.FEDFA_ANCHORS]["anchors"].numpy(), initial_anchors(3, 2, 0))
    answers = []
    for message in messages:
        p = strategy.partition_of_node[message.metadata.dst_node_id]
        content = RecordDict({
            "arrays": sent, "metrics": MetricRecord({"num-examples": 10 * (p + 1), "train-loss": 1.0}),
            protocol.OBJECTIVE_RECORD: ArrayRecord({"anchors": Array(np.full((3, 2), float(p), np.float32))}),
        })
        answers.append(Message(content=content, reply_to=message))
    strategy.aggregate_train(1, answers)
    cohort = strategy.sample_partitions(1)
    expected = sum(10 * (p + 1) * p for p in cohort) / sum(10 * (p + 1) for p in cohort)  # weighted by n_i
    np.testing.assert_allclose(strategy.anchors, np.full((3, 2), expected), rtol=1e-6)
    save_checkpoint(tmp_path / "state.pt", strategy.state_dict())
    restored = FedFa(**COHORT)
    restored.load_state_dict(load_checkpoint(tmp_path / "state.pt"))
    np.testing.assert_array_equal(restored.anchors, strategy.anchors)
