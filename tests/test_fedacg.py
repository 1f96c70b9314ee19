"""FedACG (Kim, Kim, Han, CVPR 2024): the look-ahead model sent, the server momentum, the
clients' proximal term to the look-ahead, by hand and through Messages with checkpointed state."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from clients.training import proximal_hook
from strategies.checkpoint import load_checkpoint, save_checkpoint
from strategies.fedacg import FedAcg, fedacg_server_update, lookahead
from tests.fakes import COHORT
from tests.tiny_rounds import bound, configure, f32, replies

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py


def test_fedacg_lookahead_and_server_update_by_hand():
    theta, m = {"w": f32([1.0, 2.0])}, {"w": f32([0.5, -1.0])}
    sent = lookahead(theta, m, 0.8)
    np.testing.assert_allclose(sent["w"], [1.4, 1.2], rtol=1e-6)
    # Δ̄ = mean([0.6, −0.2], [−0.4, 0.8]) = [0.1, 0.3]; m⁺ = 0.8·m + Δ̄ = [0.5, −0.5]; θ⁺ = θ̃ + Δ̄ = θ + m⁺.
    clients = [{"w": f32([2.0, 1.0]), "n": np.array([4])}, {"w": f32([1.0, 2.0]), "n": np.array([6])}]
    momentum, new = fedacg_server_update({**sent, "n": np.array([3])}, m, clients, 0.8)
    np.testing.assert_allclose(momentum["w"], [0.5, -0.5], rtol=1e-6)
    np.testing.assert_allclose(new["w"], [1.5, 1.5], rtol=1e-6)
    assert new["n"].tolist() == [5] and "n" not in momentum  # an integer buffer: the mean, no momentum


def test_fedacg_two_rounds_through_messages_and_state(tmp_path):
    strategy = bound(FedAcg(lam=0.5, beta=1e-3, **COHORT))
    theta = f32([1.0, -1.0])
    first = configure(strategy, 1, theta)
    # Round 1: m = 0, so the look-ahead is θ itself; the proximal weight is 2β (no ½).
    assert all(np.array_equal(m.content["arrays"]["w"].numpy(), theta) for m in first)
    assert {m.content["config"]["proximal-mu"] for m in first} == {2e-3}
    model_of = lambda p: theta + f32([0.1 * (p + 1), -0.2])  # noqa: E731
    arrays, _ = strategy.aggregate_train(1, replies(strategy, first, model_of))
    cohort = strategy.sample_partitions(1)
    mean_update = sum(f32([0.1 * (p + 1), -0.2]) for p in cohort) / 2  # uniform, not by sample count
    np.testing.assert_allclose(arrays["w"].numpy(), theta + mean_update, rtol=1e-6)
    np.testing.assert_allclose(strategy.momentum["w"], mean_update, rtol=1e-6)

    save_checkpoint(tmp_path / "state.pt", strategy.state_dict())
    restored = bound(FedAcg(lam=0.5, beta=1e-3, **COHORT))
    restored.load_state_dict(load_checkpoint(tmp_path / "state.pt"))
    # Round 2 from the restored state: θ̃ = θ + λ·m, against the model it is given (e.g. IMA's average).
    given = f32([0.0, 0.0])
    second = configure(restored, 2, given)
    np.testing.assert_allclose(second[0].content["arrays"]["w"].numpy(), given + 0.5 * mean_update, rtol=1e-6)


def test_fedacg_half_variant_and_bad_values():
    strategy = bound(FedAcg(lam=0.85, beta=1e-3, variant="half", **COHORT))
    assert {m.content["config"]["proximal-mu"] for m in configure(strategy, 1, [0.0, 0.0])} == {1e-3}
    with pytest.raises(ValueError, match="lam"):
        FedAcg(lam=1.0, **COHORT)
    with pytest.raises(ValueError, match="variant"):
        FedAcg(variant="paper", **COHORT)


def test_fedacg_proximal_gradient_is_2_beta_times_the_distance_to_the_lookahead():
    """The client's step with β‖y − θ̃‖²: a zero-loss objective leaves only 2β(y − θ̃)."""
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(2.0)
    hook = proximal_hook(model, 2 * 1e-3)  # anchored at θ̃ = 2
    with torch.no_grad():
        model.weight.fill_(3.0)
    model.weight.grad = torch.zeros_like(model.weight)
    hook([model.weight])
    assert model.weight.grad.item() == pytest.approx(2 * 1e-3 * (3.0 - 2.0))
