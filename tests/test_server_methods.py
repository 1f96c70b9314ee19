"""FedNova, FedDyn, FedGMA and FedSWA/FedMoSWA servers: arithmetic by hand, and one round
through Flower Messages per strategy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from clients import protocol
from clients.training import momentum_a_norm
from strategies.checkpoint import load_checkpoint, save_checkpoint
from strategies.feddyn import FedDyn, feddyn_server_update
from strategies.fedgma import FedGMA, fedgma_update, gma_mask
from strategies.fednova import FedNova, fednova_aggregate
from strategies.fedopt import FedAdam
from strategies.fedswa import (
    FedSwa,
    moswa_control_update,
    official_control_update,
    swa_server_update,
)
from tests.fakes import COHORT, FakeGrid

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py


def _np(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


# -- FedNova ------------------------------------------------------------------------------
def test_momentum_a_norm_by_hand():
    # ρ = 0.5, τ = 3: (1 − 0.5)/0.5 + (1 − 0.25)/0.5 + (1 − 0.125)/0.5 = 1 + 1.5 + 1.75
    assert momentum_a_norm(3, 0.5) == pytest.approx(4.25)
    assert momentum_a_norm(3, 0.0) == 3.0  # plain SGD: ‖a‖₁ = τ
    assert momentum_a_norm(2, 0.9) == pytest.approx(1 + 1.9)
    with pytest.raises(ValueError, match="momentum"):
        momentum_a_norm(3, 1.0)


@pytest.mark.parametrize("steps, rho", [(3, 0.5), (5, 0.9), (4, 0.0)])
def test_momentum_a_norm_matches_torch_sgd(steps, rho):
    # Loss g·w has the constant gradient g, so τ steps move w by lr·g·‖a‖₁.
    lr, g = 0.1, torch.tensor([1.0, -2.0], dtype=torch.float64)
    w = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.SGD([w], lr=lr, momentum=rho)
    for _ in range(steps):
        optimizer.zero_grad()
        (g @ w).backward()
        optimizer.step()
    np.testing.assert_allclose((-w.detach()).numpy(), (lr * g * momentum_a_norm(steps, rho)).numpy(), rtol=1e-12)


def test_fednova_aggregate_by_hand():
    # n = 1, 3 → p = 0.25, 0.75; ‖a‖₁ = 2 (τ = 2, ρ = 0) and 4.25 (τ = 3, ρ = 0.5).
    # Δ1 = w − w1 = [1, 0] → d1 = [0.5, 0];  Δ2 = [0.85, −1.7] → d2 = [0.2, −0.4]
    # Σ p d = [0.125 + 0.15, −0.3] = [0.275, −0.3];  τ_eff = 0.5 + 3.1875 = 3.6875
    # w − τ_eff Σ p d = [1 − 1.0140625, 2 + 1.10625]
    out = fednova_aggregate(
        {"w": _np([1.0, 2.0])}, [{"w": _np([0.0, 2.0])}, {"w": _np([0.15, 3.7])}], [1, 3], [2.0, 4.25]
    )
    np.testing.assert_allclose(out["w"], [-0.0140625, 3.10625], rtol=1e-12)


def test_fednova_with_equal_a_norms_is_fedavg():
    # Equal ‖a‖₁ = 3: τ_eff = 3 cancels the 1/3, leaving 0.25·[0, 4] + 0.75·[4, 0] = [3, 1]
    out = fednova_aggregate({"w": _np([1.0, 1.0])}, [{"w": _np([0.0, 4.0])}, {"w": _np([4.0, 0.0])}], [1, 3], [3.0, 3.0])
    np.testing.assert_allclose(out["w"], [3.0, 1.0], rtol=1e-12)


# -- FedDyn -------------------------------------------------------------------------------
def test_feddyn_two_rounds_by_hand():
    # α = 0.1, m = 4 clients in total, 2 per round.
    # Round 1: θ0 = [1, 0]; Σ(θ_k − θ0) = [1, 1] + [−1, 3] = [0, 4]
    #   h1 = 0 − 0.1·(1/4)·[0, 4] = [0, −0.1];  θ1 = mean [1, 2] − 10·h1 = [1, 3]
    h = {"w": np.zeros(2)}
    h, model = feddyn_server_update(h, {"w": _np([1.0, 0.0])}, [{"w": _np([2.0, 1.0])}, {"w": _np([0.0, 3.0])}], 0.1, 4)
    np.testing.assert_allclose(h["w"], [0.0, -0.1], atol=1e-15)
    np.testing.assert_allclose(model["w"], [1.0, 3.0], rtol=1e-12)
    # Round 2: Σ(θ_k − θ1) = [1, 0] + [0, 1] = [1, 1];  h2 = h1 − 0.025·[1, 1] = [−0.025, −0.125]
    #   θ2 = mean [1.5, 3.5] − 10·h2 = [1.75, 4.75]
    h, model = feddyn_server_update(h, model, [{"w": _np([2.0, 3.0])}, {"w": _np([1.0, 4.0])}], 0.1, 4)
    np.testing.assert_allclose(h["w"], [-0.025, -0.125], rtol=1e-12)
    np.testing.assert_allclose(model["w"], [1.75, 4.75], rtol=1e-12)


# -- FedGMA -------------------------------------------------------------------------------
# Updates Δ_i = w − w_i of three clients; coordinate signs: +++, ++−, −−−, 0++.
GMA_W = {"w": _np([1.0, 1.0, 1.0, 1.0])}
GMA_DELTAS = [_np([0.3, 0.6, -0.3, 0.0]), _np([0.6, 0.3, -0.6, 0.3]), _np([0.3, -0.3, -0.3, 0.6])]
GMA_CLIENTS = [{"w": GMA_W["w"] - d} for d in GMA_DELTAS]


def test_gma_mask_by_hand():
    deltas = [{"w": d} for d in GMA_DELTAS]
    # A = [1, 1/3, 1, 2/3]: at ε = 0.8 only unanimous coordinates survive; 2/3 ≥ 0.6.
    assert gma_mask(deltas, 0.8)["w"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert gma_mask(deltas, 0.6)["w"].tolist() == [1.0, 0.0, 1.0, 1.0]
    # 8 of 10 agreeing is A = 0.8 exactly, which passes ε = 0.8.
    ten = [{"w": np.array([1.0], np.float32)}] * 9 + [{"w": np.array([-1.0], np.float32)}]
    assert gma_mask(ten, 0.8)["w"].tolist() == [1.0]


def test_fedgma_update_by_hand():
    # p = [0.25, 0.25, 0.5]: Δ = [0.075 + 0.15 + 0.15, 0.15 + 0.075 − 0.15, −0.075 − 0.15 − 0.15, 0.075 + 0.3]
    #   = [0.375, 0.075, −0.375, 0.375]; mask(0.8) = [1, 0, 1, 0]; η_s = 0.5
    out = fedgma_update(GMA_W, GMA_CLIENTS, [1, 1, 2], 0.8, 0.5)
    np.testing.assert_allclose(out["w"], [1 - 0.1875, 1.0, 1 + 0.1875, 1.0], rtol=1e-12)
    # ε = 0.6 keeps the fourth coordinate; η_s = 1
    out = fedgma_update(GMA_W, GMA_CLIENTS, [1, 1, 2], 0.6, 1.0)
    np.testing.assert_allclose(out["w"], [0.625, 1.0, 1.375, 0.625], rtol=1e-12)


# -- FedSWA / FedMoSWA ----------------------------------------------------------------------
def test_moswa_control_updates_by_hand():
    m = {"w": _np([1.0, -1.0])}
    # paper: mean Δc = [−0.5, 1.5]; m + 0.5·mean = [0.75, −0.25]
    paper = moswa_control_update(m, [{"w": _np([0.5, 0.5])}, {"w": _np([-1.5, 2.5])}], gamma=0.5)
    np.testing.assert_allclose(paper["w"], [0.75, -0.25], rtol=1e-12)
    # official code: mean c⁺ = [1, 0.5]; 0.6·m + 0.4·mean = [0.6 + 0.4, −0.6 + 0.2]
    official = official_control_update(m, [{"w": _np([2.0, 0.0])}, {"w": _np([0.0, 1.0])}])
    np.testing.assert_allclose(official["w"], [1.0, -0.4], rtol=1e-12)
    first = official_control_update(m, [{"w": _np([2.0, 0.0])}, {"w": _np([0.0, 1.0])}], first=True)
    np.testing.assert_allclose(first["w"], [1.0, 0.5], rtol=1e-12)  # round 1: m = mean c⁺, not 0.4·mean


def test_fedmoswa_official_code_divides_its_control_by_fifty_steps():
    from types import SimpleNamespace

    from clients.control_variates import ControlVariate

    settings = FedSwa(momentum_control=True, variant="official-code", **COHORT).client_settings()
    assert settings[protocol.CONTROL_STEP_COUNT] == settings[protocol.LOCAL_STEPS] == 50
    # A client that ran 12 steps at the constant lr 0.1 divides by 0.1·50, not Σ η_k = 1.2.
    ran = SimpleNamespace(lr_sum=1.2, num_steps=12)
    official = SimpleNamespace(round_config={protocol.CONTROL_STEP_COUNT: 50})
    assert ControlVariate.lr_sum(official, ran) == pytest.approx(5.0)
    assert ControlVariate.lr_sum(SimpleNamespace(round_config={}), ran) == 1.2
    assert protocol.CONTROL_STEP_COUNT not in FedSwa(momentum_control=True, **COHORT).client_settings()


def test_swa_server_step_by_hand():
    # v = uniform mean [2, 4]; θ + 0.5·(v − θ) = [1.5, 3]
    out = swa_server_update({"w": _np([1.0, 2.0])}, [{"w": _np([3.0, 2.0])}, {"w": _np([1.0, 6.0])}], 0.5)
    np.testing.assert_allclose(out["w"], [1.5, 3.0], rtol=1e-12)


def test_fedswa_rejects_unknown_variant():
    with pytest.raises(ValueError, match=r"variant must be one of \('paper', 'official-code'\), got 'code'"):
        FedSwa(variant="code", **COHORT)


# -- one round through Flower Messages --------------------------------------------------------
NUM_CLIENTS = 4
GLOBAL = np.array([1.0, -1.0, 0.5], np.float32)


def _bound(strategy):
    # Partition p lives on node 1000 + 7p; 3 of 4 clients per round.
    strategy.bind_partitions({1000 + 7 * p: p for p in range(NUM_CLIENTS)}, 3, seed=0)
    return strategy


def _configure(strategy, server_round=1, arrays=GLOBAL):
    grid = FakeGrid([1000 + 7 * p for p in range(NUM_CLIENTS)])
    sent = ArrayRecord({"w": Array(np.asarray(arrays, np.float32))})
    return list(strategy.configure_train(server_round, sent, ConfigRecord({"lr": 0.1}), grid))


def _client_model(partition: int) -> np.ndarray:
    return GLOBAL - np.array([0.1 * (partition + 1), -0.2, 0.05 * partition], np.float32)


def _replies(strategy, messages, metrics=None, extra=None):
    """One reply per message: model, sample count 10·(p + 1), optional metrics and records."""
    replies = []
    for message in messages:
        p = strategy.partition_of_node[message.metadata.dst_node_id]
        content = RecordDict({
            "arrays": ArrayRecord({"w": Array(_client_model(p))}),
            "metrics": MetricRecord({"num-examples": 10 * (p + 1), "train-loss": float(p), **(metrics or {}).get(p, {})}),
        })
        for key, make in (extra or {}).items():
            content[key] = ArrayRecord({"w": Array(make(p))})
        replies.append(Message(content=content, reply_to=message))
    return replies[::-1]  # arrival order must not matter


def test_fednova_round_through_messages():
    strategy = _bound(FedNova(**COHORT))
    messages = _configure(strategy)
    a_norms = {p: {protocol.SOLVER_A_NORM: 2.0 + p} for p in range(NUM_CLIENTS)}
    arrays, metrics = strategy.aggregate_train(1, _replies(strategy, messages, metrics=a_norms))
    cohort = strategy.sample_partitions(1)
    expected = fednova_aggregate(
        {"w": GLOBAL}, [{"w": _client_model(p)} for p in cohort], [10 * (p + 1) for p in cohort], [2.0 + p for p in cohort]
    )
    assert arrays["w"].numpy().dtype == np.float32
    np.testing.assert_array_equal(arrays["w"].numpy(), expected["w"])
    assert metrics["train-loss"] == pytest.approx(sum((p + 1) * p for p in cohort) / sum(p + 1 for p in cohort))

    missing = _replies(strategy, _configure(strategy))
    with pytest.raises(ValueError, match=protocol.SOLVER_A_NORM):
        strategy.aggregate_train(1, missing)


def test_feddyn_round_through_messages_and_state(tmp_path):
    strategy = _bound(FedDyn(alpha=0.1, **COHORT))
    messages = _configure(strategy)
    assert all(m.content["config"][protocol.FEDDYN_ALPHA] == 0.1 for m in messages)
    arrays, _ = strategy.aggregate_train(1, _replies(strategy, messages))
    cohort = strategy.sample_partitions(1)
    h, expected = feddyn_server_update(
        {"w": np.zeros(3, np.float32)}, {"w": GLOBAL}, [{"w": _client_model(p)} for p in cohort], 0.1, NUM_CLIENTS
    )
    np.testing.assert_array_equal(arrays["w"].numpy(), expected["w"])
    np.testing.assert_array_equal(strategy.h["w"], h["w"])
    assert np.any(h["w"] != 0)

    save_checkpoint(tmp_path / "state.pt", strategy.state_dict())
    restored = FedDyn(alpha=0.1, **COHORT)
    restored.load_state_dict(load_checkpoint(tmp_path / "state.pt"))
    np.testing.assert_array_equal(restored.h["w"], strategy.h["w"])


def test_fedgma_round_through_messages():
    strategy = _bound(FedGMA(mask_threshold=0.8, server_learning_rate=0.5, **COHORT))
    arrays, _ = strategy.aggregate_train(2, _replies(strategy, _configure(strategy, server_round=2)))
    cohort = strategy.sample_partitions(2)
    expected = fedgma_update(
        {"w": GLOBAL}, [{"w": _client_model(p)} for p in cohort], [10 * (p + 1) for p in cohort], 0.8, 0.5
    )
    np.testing.assert_array_equal(arrays["w"].numpy(), expected["w"])
    # Partition 0 leaves the third coordinate unchanged (sign 0): agreement 2/3 < 0.8 masks it.
    assert 0 in cohort
    assert arrays["w"].numpy()[2] == GLOBAL[2] and np.all(arrays["w"].numpy()[:2] != GLOBAL[:2])


@pytest.mark.parametrize(
    "variant, momentum_control, settings",
    [
        ("paper", False, {protocol.STEP_LR_START: 1.0, protocol.STEP_LR_END: 0.25, protocol.LOCAL_STEPS: 0}),
        ("official-code", False, {protocol.STEP_LR_START: 2.0, protocol.STEP_LR_END: 0.0, protocol.LOCAL_STEPS: 0}),
        ("official-code", True, {protocol.STEP_LR_START: 1.0, protocol.STEP_LR_END: 1.0, protocol.LOCAL_STEPS: 50,
                                 protocol.CONTROL_AFTER_CLIP: True}),
    ],
)
def test_fedswa_config_entries(variant, momentum_control, settings):
    strategy = _bound(FedSwa(rho=0.25, momentum_control=momentum_control, variant=variant, **COHORT))
    messages = _configure(strategy)
    for message in messages:
        assert {k: message.content["config"][k] for k in settings} == settings
        assert (protocol.MOSWA_SERVER_CONTROL in message.content) == momentum_control


def test_fedswa_round_sends_no_control():
    strategy = _bound(FedSwa(server_step=0.5, **COHORT))
    arrays, _ = strategy.aggregate_train(1, _replies(strategy, _configure(strategy)))
    expected = swa_server_update({"w": GLOBAL}, [{"w": _client_model(p)} for p in strategy.sample_partitions(1)], 0.5)
    np.testing.assert_array_equal(arrays["w"].numpy(), expected["w"])
    assert strategy.control is None


def _delta_control(p: int) -> np.ndarray:
    return np.array([p, -1.0, 0.5], np.float32)


@pytest.mark.parametrize("variant", ["paper", "official-code"])
def test_fedmoswa_two_rounds_through_messages_and_state(variant, tmp_path):
    strategy = _bound(FedSwa(server_step=0.5, momentum_control=True, gamma=0.5, variant=variant, **COHORT))
    control = {"w": np.zeros(3, np.float32)}
    model = {"w": GLOBAL}
    for server_round in (1, 2):
        messages = _configure(strategy, server_round, model["w"])
        sent = messages[0].content[protocol.MOSWA_SERVER_CONTROL]["w"].numpy()
        np.testing.assert_array_equal(sent, control["w"])
        # Clients reply with both records; the strategy uses the variant's and drops both.
        extra = {protocol.MOSWA_DELTA_CONTROL: _delta_control, protocol.MOSWA_NEW_CONTROL: lambda p: 2 * _delta_control(p)}
        replies = _replies(strategy, messages, extra=extra)
        arrays, _ = strategy.aggregate_train(server_round, replies)
        assert all(list(r.content.array_records) == ["arrays"] for r in replies)
        cohort = strategy.sample_partitions(server_round)
        if variant == "paper":
            control = moswa_control_update(control, [{"w": _delta_control(p)} for p in cohort], 0.5)
        else:
            # The authors' code: m = mean c_i⁺ in the first round (γ = 1), then the 0.6/0.4 EMA.
            control = official_control_update(control, [{"w": 2 * _delta_control(p)} for p in cohort],
                                              first=server_round == 1)
        model = swa_server_update(model, [{"w": _client_model(p)} for p in cohort], 0.5)
        np.testing.assert_array_equal(strategy.control["w"], control["w"])
        np.testing.assert_array_equal(arrays["w"].numpy(), model["w"])

    save_checkpoint(tmp_path / "state.pt", strategy.state_dict())
    restored = FedSwa(momentum_control=True, variant=variant, **COHORT)
    restored.load_state_dict(load_checkpoint(tmp_path / "state.pt"))
    np.testing.assert_array_equal(restored.control["w"], control["w"])


def test_fedmoswa_requires_the_variants_control_record():
    strategy = _bound(FedSwa(momentum_control=True, variant="official-code", **COHORT))
    replies = _replies(strategy, _configure(strategy), extra={protocol.MOSWA_DELTA_CONTROL: _delta_control})
    with pytest.raises(ValueError, match=protocol.MOSWA_NEW_CONTROL):
        strategy.aggregate_train(1, replies)


# -- FedAdam -------------------------------------------------------------------------------
@pytest.mark.parametrize("bias_correction", [False, True])
def test_fedadam_round_one_by_hand(bias_correction):
    # Δ = w_FMA − w; m = 0.1·Δ; v = 0.01·Δ²; paper: w + η·m/(√v + τ) = w + η·0.1Δ/(0.1|Δ| + τ).
    # Flower multiplies η by √(1 − 0.99²)/(1 − 0.9²) in round 1.
    strategy = _bound(FedAdam(**COHORT, eta=0.1, eta_l=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3,
                              bias_correction=bias_correction))
    arrays, _ = strategy.aggregate_train(1, _replies(strategy, _configure(strategy)))
    cohort = strategy.sample_partitions(1)
    weights = np.array([10.0 * (p + 1) for p in cohort])
    fma = sum(w * _client_model(p).astype(np.float64) for w, p in zip(weights, cohort)) / weights.sum()
    delta = fma - GLOBAL
    eta = 0.1 * (np.sqrt(1 - 0.99**2) / (1 - 0.9**2) if bias_correction else 1.0)
    expected = GLOBAL + eta * 0.1 * delta / (np.sqrt(0.01 * delta**2) + 1e-3)
    np.testing.assert_allclose(arrays["w"].numpy(), expected, rtol=1e-5)
