"""The baselines of the seed papers' comparison tables: FedCM, FedACG, MoFedSAM,
FedLESAM, AdaBest, MIME/MimeLite and FedFA. Each method's arithmetic by hand on tiny
tensors, rounds through Flower Messages with their state checkpointed, and the clients'
terms inside the local step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from torch import nn

from clients import protocol
from clients.fedcm import fedcm_term
from clients.local_round import LocalRound
from clients.training import proximal_hook
from strategies.checkpoint import load_checkpoint, save_checkpoint
from strategies.fedacg import FedAcg, fedacg_server_update, lookahead
from strategies.fedcm import FedCm, fedcm_server_update
from tests.fakes import COHORT, FakeGrid

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py
NODES = {1000 + 7 * p: p for p in range(4)}


def _f32(values) -> np.ndarray:
    return np.asarray(values, np.float32)


def configure(strategy, server_round, theta, lr=0.1):
    sent = ArrayRecord({"w": Array(_f32(theta)), "n": Array(np.array([3], np.int64))})
    return list(strategy.configure_train(server_round, sent, ConfigRecord({"lr": lr}), FakeGrid(NODES)))


def replies(strategy, messages, model_of, steps_of=lambda p: 5):
    out = []
    for message in messages:
        p = strategy.partition_of_node[message.metadata.dst_node_id]
        content = RecordDict({
            "arrays": ArrayRecord({"w": Array(_f32(model_of(p))), "n": Array(np.array([4 + 2 * p], np.int64))}),
            "metrics": MetricRecord({"num-examples": 10 * (p + 1), "train-loss": 1.0, "local-steps": steps_of(p)}),
        })
        out.append(Message(content=content, reply_to=message))
    return out[::-1]  # arrival order must not matter


def bound(strategy):
    strategy.bind_partitions(NODES, 2, seed=0)  # 2 of 4 clients per round
    return strategy


# -- FedACG ------------------------------------------------------------------------------------
def test_fedacg_lookahead_and_server_update_by_hand():
    theta, m = {"w": _f32([1.0, 2.0])}, {"w": _f32([0.5, -1.0])}
    sent = lookahead(theta, m, 0.8)
    np.testing.assert_allclose(sent["w"], [1.4, 1.2], rtol=1e-6)
    # Δ̄ = mean([0.6, −0.2], [−0.4, 0.8]) = [0.1, 0.3]; m⁺ = 0.8·m + Δ̄ = [0.5, −0.5]; θ⁺ = θ̃ + Δ̄ = θ + m⁺.
    clients = [{"w": _f32([2.0, 1.0]), "n": np.array([4])}, {"w": _f32([1.0, 2.0]), "n": np.array([6])}]
    momentum, new = fedacg_server_update({**sent, "n": np.array([3])}, m, clients, 0.8)
    np.testing.assert_allclose(momentum["w"], [0.5, -0.5], rtol=1e-6)
    np.testing.assert_allclose(new["w"], [1.5, 1.5], rtol=1e-6)
    assert new["n"].tolist() == [5] and "n" not in momentum  # an integer buffer: the mean, no momentum


def test_fedacg_two_rounds_through_messages_and_state(tmp_path):
    strategy = bound(FedAcg(lam=0.5, beta=1e-3, **COHORT))
    theta = _f32([1.0, -1.0])
    first = configure(strategy, 1, theta)
    # Round 1: m = 0, so the look-ahead is θ itself; the proximal weight is 2β (no ½).
    assert all(np.array_equal(m.content["arrays"]["w"].numpy(), theta) for m in first)
    assert {m.content["config"]["proximal-mu"] for m in first} == {2e-3}
    model_of = lambda p: theta + _f32([0.1 * (p + 1), -0.2])  # noqa: E731
    arrays, _ = strategy.aggregate_train(1, replies(strategy, first, model_of))
    cohort = strategy.sample_partitions(1)
    mean_update = sum(_f32([0.1 * (p + 1), -0.2]) for p in cohort) / 2  # uniform, not by sample count
    np.testing.assert_allclose(arrays["w"].numpy(), theta + mean_update, rtol=1e-6)
    np.testing.assert_allclose(strategy.momentum["w"], mean_update, rtol=1e-6)

    save_checkpoint(tmp_path / "state.pt", strategy.state_dict())
    restored = bound(FedAcg(lam=0.5, beta=1e-3, **COHORT))
    restored.load_state_dict(load_checkpoint(tmp_path / "state.pt"))
    # Round 2 from the restored state: θ̃ = θ + λ·m, against the model it is given (e.g. IMA's average).
    given = _f32([0.0, 0.0])
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


# -- FedCM -------------------------------------------------------------------------------------
def test_fedcm_server_update_by_hand():
    sent = {"w": _f32([1.0, 2.0]), "n": np.array([3])}
    clients = [{"w": _f32([0.0, 3.0]), "n": np.array([4])}, {"w": _f32([1.0, 1.0]), "n": np.array([7])}]
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
    theta = _f32([1.0, -1.0])
    first = configure(strategy, 1, theta)
    assert all(np.array_equal(m.content[protocol.FEDCM_DIRECTION]["w"].numpy(), [0.0, 0.0]) for m in first)  # Δ_0 = 0
    assert {(m.content["config"][protocol.FEDCM_ALPHA], m.content["config"][protocol.FEDCM_SCALE]) for m in first} == {
        (0.1, "client" if variant == "per-client" else "none")}
    model_of = lambda p: theta - _f32([0.2 * (p + 1), 0.1])  # noqa: E731
    steps_of = lambda p: 4 + p  # the server variant takes K of the first client in partition order  # noqa: E731
    arrays, _ = strategy.aggregate_train(1, replies(strategy, first, model_of, steps_of))
    cohort = strategy.sample_partitions(1)
    mean_step = sum(_f32([0.2 * (p + 1), 0.1]) for p in cohort) / 2
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
    local_round = LocalRound(model, content, RecordDict(), np.random.default_rng(0))
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
    local_round = LocalRound(model, content, RecordDict(), np.random.default_rng(0))
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


# -- FedLESAM ----------------------------------------------------------------------------------
def _linear_model(weight, bias):
    model = nn.Sequential(nn.Flatten(), nn.Linear(2, 2))
    with torch.no_grad():
        model[1].weight.copy_(torch.tensor(weight))
        model[1].bias.copy_(torch.tensor(bias))
    return model


def _fedlesam_round(model, state, x, y, rho, lr, records=None):
    config = ConfigRecord({"lr": lr, "local-epochs": 1, "batch-size": len(y), "momentum": 0.0, "weight-decay": 0.0,
                           "grad-clip": 0.0, "seed": 0, protocol.LOCAL_STEPS: 1, protocol.OBJECTIVE: "fedlesam",
                           "sam-rho": rho})
    content = RecordDict({"config": config, **(records or {})})
    local_round = LocalRound(model, content, state, np.random.default_rng(0))
    result = local_round.train(model, x, y, torch.Generator().manual_seed(0))
    local_round.finish(model, result)


def test_fedlesam_perturbs_from_the_clients_stored_global_model():
    """Round 1: no stored model, a plain SGD step, and θ^t kept; round 2 from a new global
    model: ε = ρ·(θ^{τ_i} − θ^t)/‖θ^{τ_i} − θ^t‖, the gradient taken at θ^t + ε."""
    x, y = torch.tensor([[[[1.0, -2.0]]], [[[0.5, 1.0]]]]), torch.tensor([0, 1])
    rho, lr = 0.3, 0.1
    first_global = ([[0.1, 0.2], [-0.3, 0.4]], [0.0, 0.1])
    model, state = _linear_model(*first_global), RecordDict()
    plain = _linear_model(*first_global)
    nn.functional.cross_entropy(plain(x), y).backward()
    _fedlesam_round(model, state, x, y, rho, lr)
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p.detach(), q.detach() - lr * q.grad)  # round 1: plain SGD
    stored = state[protocol.FEDLESAM_PREVIOUS_GLOBAL].to_torch_state_dict()
    torch.testing.assert_close(stored["1.weight"], torch.tensor(first_global[0]))  # θ^{τ_i} = round 1's θ^t

    second_global = ([[0.5, 0.0], [0.1, -0.2]], [0.2, -0.1])
    model = _linear_model(*second_global)
    theta = [p.detach().clone() for p in model.parameters()]
    previous = [torch.tensor(first_global[0]), torch.tensor(first_global[1])]
    difference = [a - b for a, b in zip(previous, theta)]
    norm = torch.sqrt(sum((d ** 2).sum() for d in difference))
    at = [(t + rho * d / norm).requires_grad_() for t, d in zip(theta, difference)]
    grads = torch.autograd.grad(nn.functional.cross_entropy(nn.functional.linear(x.flatten(1), at[0], at[1]), y), at)
    _fedlesam_round(model, state, x, y, rho, lr)
    for p, t, g in zip(model.parameters(), theta, grads):
        torch.testing.assert_close(p.detach(), t - lr * g)  # the step leaves ε out of the weights
    torch.testing.assert_close(state[protocol.FEDLESAM_PREVIOUS_GLOBAL].to_torch_state_dict()["1.bias"],
                               torch.tensor(second_global[1]))


def test_fedlesam_official_code_variant_uses_the_last_global_update():
    from strategies.fedlesam import FedLesam

    strategy = bound(FedLesam(rho=0.1, variant="official-code", **COHORT))
    first = configure(strategy, 1, [1.0, -1.0])
    assert first[0].content["config"][protocol.OBJECTIVE] == "fedlesam"
    np.testing.assert_array_equal(first[0].content[protocol.FEDLESAM_UPDATE]["w"].numpy(), [0.0, 0.0])  # u = 0
    second = configure(strategy, 2, [1.5, -2.0])
    np.testing.assert_allclose(second[0].content[protocol.FEDLESAM_UPDATE]["w"].numpy(), [0.5, -1.0])
    assert "n" not in second[0].content[protocol.FEDLESAM_UPDATE]  # integer buffers: no update
    paper = bound(FedLesam(rho=0.1, **COHORT))
    assert protocol.FEDLESAM_UPDATE not in configure(paper, 1, [1.0, -1.0])[0].content

    # The client: ε = −ρ·u/‖u‖, and no state kept.
    x, y = torch.tensor([[[[1.0, -2.0]]]]), torch.tensor([1])
    model, state = _linear_model([[0.5, 0.0], [0.1, -0.2]], [0.2, -0.1]), RecordDict()
    update = {"1.weight": torch.tensor([[0.3, 0.0], [0.0, -0.4]]), "1.bias": torch.zeros(2)}
    theta = [p.detach().clone() for p in model.parameters()]
    norm = 0.5
    at = [(t - 0.1 * update[n] / norm).requires_grad_() for t, n in zip(theta, ("1.weight", "1.bias"))]
    grads = torch.autograd.grad(nn.functional.cross_entropy(nn.functional.linear(x.flatten(1), at[0], at[1]), y), at)
    _fedlesam_round(model, state, x, y, 0.1, 0.1, {protocol.FEDLESAM_UPDATE: ArrayRecord(update)})
    for p, t, g in zip(model.parameters(), theta, grads):
        torch.testing.assert_close(p.detach(), t - 0.1 * g)
    assert protocol.FEDLESAM_PREVIOUS_GLOBAL not in state


# -- AdaBest -----------------------------------------------------------------------------------
def _weights(model, values):
    with torch.no_grad():
        model.weight.copy_(torch.tensor(values))


@pytest.mark.parametrize("official_code", [False, True])
def test_adabest_client_bias_decays_by_the_rounds_since_the_clients_last_round(official_code):
    from clients.adabest import AdaBestClient

    model, state = nn.Linear(2, 1, bias=False), RecordDict()
    _weights(model, [[1.0, 1.0]])
    first = AdaBestClient(model, state, 0.1, 2, official_code, 0.0, 1)
    assert first.state_norm() == 0.0
    _weights(model, [[0.0, 3.0]])
    first.finish(model)  # first round: h = μ·(θ − y) (official code: θ − y)
    step = 1.0 if official_code else 0.1
    torch.testing.assert_close(state[protocol.ADABEST_CLIENT_BIAS].to_torch_state_dict()["weight"],
                               torch.tensor([[1.0, -2.0]]) * step)

    _weights(model, [[2.0, 0.0]])
    again = AdaBestClient(model, state, 0.1, 5, official_code, 8.0, 2)  # t = 5, t_i′ = 2: divide by 3
    _weights(model, [[1.0, 1.0]])
    again.finish(model)
    expected = torch.tensor([[1.0, -2.0]]) * step / 3 + step * torch.tensor([[1.0, -1.0]])
    torch.testing.assert_close(state[protocol.ADABEST_CLIENT_BIAS].to_torch_state_dict()["weight"], expected)
    assert int(state[protocol.ADABEST_LAST_ROUND].to_torch_state_dict()["round"]) == 5

    # The step's correction: g − h_i, or g − μ_ad·h_i with μ_ad = μ·m̄·E/n_i = 0.1·8·2/4.
    term = again.term(num_examples=4)
    model.weight.grad = torch.zeros(1, 2)
    term([model.weight])
    scale = 0.1 * 8.0 * 2 / 4 if official_code else 1.0
    torch.testing.assert_close(model.weight.grad, -scale * torch.tensor([[1.0, -2.0]]) * step)


def test_adabest_server_update_by_hand():
    from strategies.adabest import adabest_server_update

    previous = {"w": _f32([1.0, 1.0]), "n": np.array([3])}
    clients = [{"w": _f32([2.0, 0.0]), "n": np.array([4])}, {"w": _f32([0.0, 3.0]), "n": np.array([8])}]
    # θ̄ = (1·[2, 0] + 3·[0, 3])/4 = [0.5, 2.25]; θ = θ̄ − 0.5·(θ̄⁻ − θ̄) = [0.5, 2.25] − 0.5·[0.5, −1.25]
    theta, average = adabest_server_update(previous, clients, [1.0, 3.0], 0.5)
    np.testing.assert_allclose(average["w"], [0.5, 2.25])
    np.testing.assert_allclose(theta["w"], [0.25, 2.875])
    assert theta["n"].tolist() == average["n"].tolist() == [7]


def test_adabest_two_rounds_through_messages_and_state(tmp_path):
    from strategies.adabest import AdaBest, adabest_server_update

    strategy = bound(AdaBest(mu=0.02, beta=0.5, variant="official-code", **COHORT))
    theta0 = _f32([1.0, -1.0])
    first = configure(strategy, 1, theta0)
    config = first[0].content["config"]
    assert (config[protocol.ADABEST_MU], config[protocol.ADABEST_OFFICIAL_CODE], config[protocol.ADABEST_MEAN_EXAMPLES_PER_STEP]) \
        == (0.02, True, 0.0)  # m̄ = 0 before any reply
    model_of = lambda p: theta0 + _f32([0.1 * (p + 1), -0.3])  # noqa: E731
    arrays, _ = strategy.aggregate_train(1, replies(strategy, first, model_of, steps_of=lambda p: 2 + p))
    cohort = strategy.sample_partitions(1)
    clients = [{"w": model_of(p), "n": np.array([4 + 2 * p])} for p in cohort]
    expected, average = adabest_server_update({"w": theta0, "n": np.array([3])}, clients,
                                              [10.0 * (p + 1) for p in cohort], 0.5)
    np.testing.assert_allclose(arrays["w"].numpy(), expected["w"], rtol=1e-6)
    mean_examples_per_step = np.mean([10 * (p + 1) / (2 + p) for p in cohort])
    save_checkpoint(tmp_path / "state.pt", strategy.state_dict())
    restored = bound(AdaBest(mu=0.02, beta=0.5, variant="official-code", **COHORT))
    restored.load_state_dict(load_checkpoint(tmp_path / "state.pt"))
    np.testing.assert_allclose(restored.previous_average["w"], average["w"], rtol=1e-6)
    second = configure(restored, 2, arrays["w"].numpy())
    assert second[0].content["config"][protocol.ADABEST_MEAN_EXAMPLES_PER_STEP] == pytest.approx(mean_examples_per_step)
    with pytest.raises(ValueError, match="beta"):
        AdaBest(beta=1.0, **COHORT)


# -- MIME / MimeLite ---------------------------------------------------------------------------
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
    local_round = LocalRound(model, content, RecordDict(), np.random.default_rng(0))
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

    sent, m, c = {"w": _f32([1.0, 2.0]), "n": np.array([3])}, {"w": _f32([0.5, 0.0])}, {"w": _f32([1.0, -1.0])}
    clients = [{"w": _f32([0.0, 2.0]), "n": np.array([5])}, {"w": _f32([1.0, 1.0]), "n": np.array([5])}]
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
            reply = Message(content=RecordDict({"gradient": ArrayRecord({"w": Array(_f32([p + 1, -(p + 1)]))})}),
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
    theta = _f32([1.0, -1.0])
    strategy.prepare_round(1, ArrayRecord({"w": Array(theta)}), grid)
    cohort = strategy.sample_partitions(1)
    assert sorted(NODES[node] for node, _ in grid.asked) == cohort
    assert {kind for _, kind in grid.asked} == {f"query.{protocol.FULL_GRADIENT_ACTION}"}
    c = sum(_f32([p + 1, -(p + 1)]) for p in cohort) / len(cohort)  # uniform mean
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


# -- FedFA -------------------------------------------------------------------------------------
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
