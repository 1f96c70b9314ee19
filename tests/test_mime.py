"""MIME and MimeLite (Karimireddy et al., NeurIPS 2021): the full-batch gradient exchanged before
training, the corrected gradient with frozen momentum in a local step, the server update."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from torch import nn

from clients import protocol
from clients.local_round import LocalRound
from strategies.checkpoint import load_checkpoint, save_checkpoint
from tests.fakes import COHORT, NO_CLIENT, FakeGrid
from tests.tiny_rounds import NODES, bound, configure, f32, replies

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py


def test_full_gradient_is_the_mean_gradient_over_every_example():
    from clients.mime import full_gradient

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3, 4))
    x, y = torch.randn(10, 1, 1, 3), torch.randint(0, 4, (10,))
    gradient = full_gradient(model, x, y, batch_size=3)  # 3 + 3 + 3 + 1: batches summed, not averaged
    expected = torch.autograd.grad(nn.functional.cross_entropy(model(x), y), list(model.parameters()))
    for (name, _), want in zip(model.named_parameters(), expected):
        torch.testing.assert_close(gradient[name], want)
    assert all(p.grad is None for p in model.parameters())  # no update, nothing left behind


def test_mime_corrected_gradient_and_frozen_momentum_in_one_local_step():
    """y ← y − η_l·(β·m + ∇ℓ(y; ζ) − ∇ℓ(θ; ζ) + c): after one step from θ the two batch
    gradients cancel (y = θ), so the first step is −η_l·(β·m + c); the second is checked by hand."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3, 2))
    x, y = torch.randn(8, 1, 1, 3), torch.randint(0, 2, (8,))
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    c = {n: torch.randn_like(p) for n, p in theta.items()}
    m = {n: torch.randn_like(p) for n, p in theta.items()}
    beta, lr = 0.9, 0.1
    config = ConfigRecord({"lr": lr, "local-epochs": 1, "batch-size": 4, "momentum": 0.0, "weight-decay": 0.0,
                           "grad-clip": 0.0, "seed": 0, protocol.LOCAL_STEPS: 2, protocol.OBJECTIVE: "mime",
                           protocol.MIME_MOMENTUM: beta, protocol.MIME_DAMPENED: False})
    content = RecordDict({"config": config, protocol.MIME_STATE: ArrayRecord(m), protocol.MIME_CORRECTION: ArrayRecord(c)})
    generator = torch.Generator().manual_seed(3)
    order = torch.randperm(8, generator=torch.Generator().manual_seed(3))  # the batches train_local draws
    local_round = LocalRound(model, content, RecordDict(), np.random.default_rng(0), NO_CLIENT)
    local_round.train(model, x, y, generator)

    names = list(theta)
    w = {n: theta[n] - lr * (beta * m[n] + c[n]) for n in names}  # step 1
    batch = order[4:8]
    loss = lambda p: nn.functional.cross_entropy(nn.functional.linear(x[batch].flatten(1), p[0], p[1]), y[batch])  # noqa: E731
    at_y = torch.autograd.grad(loss([w[n].requires_grad_() for n in names]), [w[n] for n in names])
    theta_params = [theta[n].clone().requires_grad_() for n in names]
    at_theta = torch.autograd.grad(loss(theta_params), theta_params)
    for i, n in enumerate(names):
        want = w[n].detach() - lr * (beta * m[n] + at_y[i] - at_theta[i] + c[n])
        torch.testing.assert_close(dict(model.named_parameters())[n].detach(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(content[protocol.MIME_STATE].to_torch_state_dict()["1.weight"], m["1.weight"])  # m frozen


def test_mime_server_update_by_hand():
    from strategies.mime import mime_server_update

    sent, m, c = {"w": f32([1.0, 2.0]), "n": np.array([3])}, {"w": f32([0.5, 0.0])}, {"w": f32([1.0, -1.0])}
    clients = [{"w": f32([0.0, 2.0]), "n": np.array([5])}, {"w": f32([1.0, 1.0]), "n": np.array([5])}]
    # mean(θ − y_i) = [0.5, 0.5]; θ⁺ = θ − 0.1·that; m⁺ = 0.9·m + c, or 0.9·m + 0.1·c (dampened).
    theta, momentum = mime_server_update(sent, clients, 0.1, m, c, 0.9, dampened=False)
    np.testing.assert_allclose(theta["w"], [0.95, 1.95], rtol=1e-6)
    np.testing.assert_allclose(momentum["w"], [1.45, -1.0], rtol=1e-6)
    _, dampened = mime_server_update(sent, clients, 0.1, m, c, 0.9, dampened=True)
    np.testing.assert_allclose(dampened["w"], [0.55, -0.1], rtol=1e-6)
    assert theta["n"].tolist() == [5]


class AnsweringGrid(FakeGrid):
    """Answers full-gradient queries at once: node p's gradient is [p + 1, −(p + 1)]."""

    def __init__(self):
        super().__init__(NODES)
        self.asked = []
        self.pending = {}

    def push_messages(self, messages):
        ids = []
        for k, message in enumerate(messages):
            self.asked.append((message.metadata.dst_node_id, message.metadata.message_type))
            p = NODES[message.metadata.dst_node_id]
            reply = Message(content=RecordDict({"gradient": ArrayRecord({"w": Array(f32([p + 1, -(p + 1)]))})}),
                            reply_to=message)
            self.pending[f"q{len(self.asked)}"] = reply
            ids.append(f"q{len(self.asked)}")
        return ids

    def pull_messages(self, message_ids):
        out = []
        for message_id in list(message_ids):
            reply = self.pending.pop(message_id)
            reply.metadata.__dict__["_reply_to_message_id"] = message_id
            out.append(reply)
        return out


@pytest.mark.parametrize("lite", [False, True])
def test_mime_round_exchanges_full_gradients_with_the_training_cohort_first(lite, tmp_path):
    from strategies.mime import Mime

    strategy = bound(Mime(lite=lite, beta=0.5, server_learning_rate=1.0, **COHORT))
    grid = AnsweringGrid()
    theta = f32([1.0, -1.0])
    strategy.prepare_round(1, ArrayRecord({"w": Array(theta)}), grid)
    cohort = strategy.sample_partitions(1)
    assert sorted(NODES[node] for node, _ in grid.asked) == cohort
    assert {kind for _, kind in grid.asked} == {f"query.{protocol.FULL_GRADIENT_ACTION}"}
    c = sum(f32([p + 1, -(p + 1)]) for p in cohort) / len(cohort)  # uniform mean
    np.testing.assert_allclose(strategy.full_gradient["w"], c)
    messages = configure(strategy, 1, theta)
    content = messages[0].content
    assert (protocol.MIME_CORRECTION in content) is not lite and protocol.MIME_STATE in content
    assert (content["config"].get(protocol.OBJECTIVE) == "mime") is not lite
    arrays, _ = strategy.aggregate_train(1, replies(strategy, messages, lambda p: theta - 0.1 * (p + 1)))
    np.testing.assert_allclose(strategy.momentum["w"], c)  # m = c after round 1
    np.testing.assert_allclose(arrays["w"].numpy(), theta - np.mean([0.1 * (p + 1) for p in cohort]), rtol=1e-6)
    save_checkpoint(tmp_path / "state.pt", strategy.state_dict())
    restored = Mime(lite=lite, beta=0.5, **COHORT)
    restored.load_state_dict(load_checkpoint(tmp_path / "state.pt"))
    np.testing.assert_allclose(restored.momentum["w"], c)
    assert not Mime(lite=True, beta=0.0, **COHORT).needs_full_gradients  # MimeLite over SGD: FedAvg, no exchange
