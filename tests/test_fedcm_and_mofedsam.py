"""FedCM (Xu et al. 2021) and MoFedSAM (Qu et al., ICML 2022), which shares FedCM's server: the
server's momentum direction by hand, rounds through Messages, and the direction mixed into
each local step (after SAM's gradient for MoFedSAM)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from torch import nn

from clients import protocol
from clients.fedcm import fedcm_term
from clients.local_round import LocalRound
from strategies.checkpoint import load_checkpoint, save_checkpoint
from strategies.fedcm import FedCm, fedcm_server_update
from tests.fakes import COHORT, NO_CLIENT
from tests.tiny_rounds import bound, configure, f32, replies

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py


def test_fedcm_server_update_by_hand():
    sent = {"w": f32([1.0, 2.0]), "n": np.array([3])}
    clients = [{"w": f32([0.0, 3.0]), "n": np.array([4])}, {"w": f32([1.0, 1.0]), "n": np.array([7])}]
    # y_i − θ = [−1, 1], [0, −1]: mean [−0.5, 0]; θ⁺ = θ + 1·that; D = mean(θ − y_i) = [0.5, 0].
    theta, direction = fedcm_server_update(sent, clients, 1.0)
    np.testing.assert_allclose(theta["w"], [0.5, 2.0])
    np.testing.assert_allclose(direction["w"], [0.5, 0.0])
    assert theta["n"].tolist() == [6] and "n" not in direction  # round half to even: 5.5 → 6
    # The server-scaled variant: D/(η_l·K) with η_l = 0.1, K = 5; a server lr of 0.5.
    theta, scaled = fedcm_server_update(sent, clients, 0.5, step_scale=1 / (0.1 * 5))
    np.testing.assert_allclose(scaled["w"], [1.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(theta["w"], [0.75, 2.0], rtol=1e-6)


@pytest.mark.parametrize("variant, expected_scale", [("per-client", 1.0), ("server", 1 / (0.1 * 4))])
def test_fedcm_two_rounds_through_messages_and_state(variant, expected_scale, tmp_path):
    strategy = bound(FedCm(alpha=0.1, variant=variant, **COHORT))
    theta = f32([1.0, -1.0])
    first = configure(strategy, 1, theta)
    assert all(np.array_equal(m.content[protocol.FEDCM_DIRECTION]["w"].numpy(), [0.0, 0.0]) for m in first)  # Δ_0 = 0
    assert {(m.content["config"][protocol.FEDCM_ALPHA], m.content["config"][protocol.FEDCM_SCALE]) for m in first} == {
        (0.1, "client" if variant == "per-client" else "none")}
    model_of = lambda p: theta - f32([0.2 * (p + 1), 0.1])  # noqa: E731
    steps_of = lambda p: 4 + p  # the server variant takes K of the first client in partition order  # noqa: E731
    arrays, _ = strategy.aggregate_train(1, replies(strategy, first, model_of, steps_of))
    cohort = strategy.sample_partitions(1)
    mean_step = sum(f32([0.2 * (p + 1), 0.1]) for p in cohort) / 2
    np.testing.assert_allclose(arrays["w"].numpy(), theta - mean_step, rtol=1e-6)
    scale = expected_scale if variant == "per-client" else 1 / (0.1 * steps_of(cohort[0]))
    save_checkpoint(tmp_path / "state.pt", strategy.state_dict())
    restored = bound(FedCm(alpha=0.1, variant=variant, **COHORT))
    restored.load_state_dict(load_checkpoint(tmp_path / "state.pt"))
    second = configure(restored, 2, theta)
    np.testing.assert_allclose(second[0].content[protocol.FEDCM_DIRECTION]["w"].numpy(), mean_step * scale, rtol=1e-6)


def test_fedcm_client_mixes_the_direction_before_clipping():
    """v = α·g + (1 − α)·D/(η_l·K_i), then the clip to the global norm bounds v itself."""
    model = nn.Linear(2, 1, bias=False)
    term = fedcm_term(model, {"weight": torch.tensor([[2.0, -4.0]])}, 0.25, 1 / (0.5 * 4))
    model.weight.grad = torch.tensor([[4.0, 8.0]])
    term([model.weight])
    # 0.25·[4, 8] + 0.75·[2, −4]/2 = [1, 2] + [0.75, −1.5]
    torch.testing.assert_close(model.weight.grad, torch.tensor([[1.75, 0.5]]))


def test_fedcm_round_on_a_client_scales_by_its_own_lr_and_steps():
    """LocalRound builds FedCM's term with this client's η_l·K_i: with α all but 0, each of
    the K steps moves the weights by −η_l·(1 − α)·D/(η_l·K), the round by −(1 − α)·D."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    x, y = torch.randn(12, 1, 2, 2), torch.randint(0, 2, (12,))
    direction = {name: torch.full_like(p, 0.3) for name, p in model.state_dict().items()}
    alpha = 1e-6  # the local gradient all but switched off: the steps follow D
    config = ConfigRecord({"lr": 0.05, "local-epochs": 1, "batch-size": 4, "momentum": 0.0, "weight-decay": 0.0,
                           "grad-clip": 0.0, "seed": 0, protocol.FEDCM_ALPHA: alpha, protocol.FEDCM_SCALE: "client"})
    content = RecordDict({"config": config, protocol.FEDCM_DIRECTION: ArrayRecord(direction)})
    before = [p.detach().clone() for p in model.parameters()]
    local_round = LocalRound(model, content, RecordDict(), np.random.default_rng(0), NO_CLIENT)
    result = local_round.train(model, x, y, torch.Generator().manual_seed(0))
    assert result.num_steps == 3
    for start, param in zip(before, model.parameters()):
        # K = 3 steps of −η_l·(1 − α)·0.3/(η_l·3): the weights move by −(1 − α)·0.3 in all.
        torch.testing.assert_close(param.detach() - start, torch.full_like(start, -0.3), atol=1e-4, rtol=0)


# -- MoFedSAM ----------------------------------------------------------------------------------
def test_mofedsam_takes_the_sam_gradient_then_mixes_in_the_direction():
    """One local step by hand: ε from the plain gradient only, g̃ at y + ε, then
    v = α·g̃ + (1 − α)·Δ_t and y ← y − η_l·v."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3, 2))
    x, y = torch.randn(4, 1, 1, 3), torch.tensor([0, 1, 1, 0])
    rho, alpha, lr = 0.5, 0.3, 0.1
    direction = {name: torch.randn_like(p) for name, p in model.state_dict().items()}

    reference = [p.detach().clone().requires_grad_() for p in model.parameters()]
    loss = lambda w: nn.functional.cross_entropy(nn.functional.linear(x.flatten(1), w[0], w[1]), y)  # noqa: E731
    g = torch.autograd.grad(loss(reference), reference)
    norm = torch.sqrt(sum((gi ** 2).sum() for gi in g))
    perturbed = [(w + rho * gi / (norm + 1e-7)).detach().requires_grad_() for w, gi in zip(reference, g)]
    g_sam = torch.autograd.grad(loss(perturbed), perturbed)
    d = [direction[name] for name, _ in model.named_parameters()]
    expected = [w.detach() - lr * (alpha * gs + (1 - alpha) * di) for w, gs, di in zip(reference, g_sam, d)]

    config = ConfigRecord({"lr": lr, "local-epochs": 1, "batch-size": 4, "momentum": 0.0, "weight-decay": 0.0,
                           "grad-clip": 0.0, "seed": 0, protocol.LOCAL_STEPS: 1, protocol.OBJECTIVE: "mofedsam",
                           "sam-rho": rho, protocol.FEDCM_ALPHA: alpha, protocol.FEDCM_SCALE: "none"})
    content = RecordDict({"config": config, protocol.FEDCM_DIRECTION: ArrayRecord(direction)})
    local_round = LocalRound(model, content, RecordDict(), np.random.default_rng(0), NO_CLIENT)
    local_round.train(model, x, y, torch.Generator().manual_seed(0))
    for param, want in zip(model.parameters(), expected):
        torch.testing.assert_close(param.detach(), want, rtol=1e-5, atol=1e-6)


def test_mofedsam_server_is_fedcms_and_names_the_sam_objective():
    from strategies.mofedsam import MoFedSam

    strategy = bound(MoFedSam(rho=0.1, alpha=0.1, **COHORT))
    messages = configure(strategy, 1, [1.0, -1.0])
    config = messages[0].content["config"]
    assert (config[protocol.OBJECTIVE], config["sam-rho"], config[protocol.FEDCM_ALPHA]) == ("mofedsam", 0.1, 0.1)
    assert protocol.FEDCM_DIRECTION in messages[0].content
    with pytest.raises(ValueError, match="rho"):
        MoFedSam(rho=0.0, **COHORT)
