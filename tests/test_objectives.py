"""Client-side methods' arithmetic on tiny tensors, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from torch import nn
from torch.nn import functional as F

from clients import protocol
from clients.control_variates import ControlVariateClient
from clients.feddyn import FedDynClient
from clients.local_round import LocalRound, training_config
from clients.models import build_model
from clients.models.slimmable import sliced_channels
from clients.objectives.fedalign import FedAlign, scaled_lipschitz_loss, top_singular_value, transmitting_matrix
from clients.objectives.gradaug import GradAug
from clients.objectives.mixup import Mixup
from clients.objectives.moon import Moon, contrastive_loss
from clients.objectives.sam import SharpnessAware
from clients.objectives.stochastic_depth import StochasticDepth, drop_rates
from clients.protocol import FEDDYN_CLIENT_GRADIENT, MOON_PREVIOUS_MODEL, MOSWA_CLIENT_CONTROL
from clients.training import LocalObjective, LocalTrainingConfig, in_round_lrs, train_local
from strategies.fedswa import FedSwa, moswa_control_update
from tests.fakes import NO_CLIENT, FakeGrid, bound_strategy


def _linear(weight: list[float]) -> nn.Linear:
    model = nn.Linear(len(weight), 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([weight]))
    return model


# --- FedSWA / FedMoSWA ------------------------------------------------------------------

def test_fedswa_in_round_lr_sequence_by_hand():
    # η_k = η(1 − k/K) + (k/K)ρη with η = 0.1, K = 4, ρ = 0.5
    assert in_round_lrs(0.1, 4, 1.0, 0.5) == pytest.approx([0.1, 0.0875, 0.075, 0.0625])
    # official code: from 2η down to 0
    assert in_round_lrs(0.1, 4, 2.0, 0.0) == pytest.approx([0.2, 0.15, 0.1, 0.05])


class _HalfSquaredNorm(LocalObjective):
    """L(w) = ½‖w‖², so g = w: SGD steps are easy to follow by hand."""

    def backward(self, model, x, y):
        loss = 0.5 * sum((p**2).sum() for p in model.parameters())
        loss.backward()
        return loss.detach()


def test_local_steps_and_in_round_lrs_drive_the_optimizer():
    model = _linear([1.0])
    config = LocalTrainingConfig(lr=0.1, local_epochs=99, batch_size=1, local_steps=3, step_lr_start=1.0, step_lr_end=0.4)
    x, y = torch.zeros(2, 1), torch.zeros(2, dtype=torch.long)
    result = train_local(model, x, y, config, torch.Generator().manual_seed(0), objective=_HalfSquaredNorm())
    # η = 0.1, 0.08, 0.06 (ρ = 0.4, K = 3); w ← w(1 − η_k): 1 · 0.9 · 0.92 · 0.94
    assert result.num_steps == 3
    assert result.lr_sum == pytest.approx(0.24)
    assert model.weight.item() == pytest.approx(0.9 * 0.92 * 0.94)


@pytest.mark.parametrize("nesterov, expected", [(False, 0.72), (True, 0.5751)])
def test_nesterov_momentum_by_hand(nesterov, expected):
    # L = ½w², w = 1, η = 0.1, β = 0.9. Heavy ball: 0.9, then b = 0.9 + 0.9 = 1.8 → 0.72.
    # Nesterov (g + β·b): b = 1, w = 1 − 0.1·1.9 = 0.81; b = 0.9 + 0.81 = 1.71, w = 0.81 − 0.1·(0.81 + 1.539).
    round_config = {"lr": 0.1, "local-epochs": 1, "batch-size": 1, "momentum": 0.9, "weight-decay": 0.0,
                    "grad-clip": 0.0, "nesterov": nesterov, "local-steps": 2}
    model = _linear([1.0])
    x, y = torch.zeros(2, 1), torch.zeros(2, dtype=torch.long)
    train_local(model, x, y, training_config(round_config), torch.Generator().manual_seed(0), objective=_HalfSquaredNorm())
    assert model.weight.item() == pytest.approx(expected)


def test_fedmoswa_client_control_by_hand():
    # c_i⁺ = c_i − m + (θ^{t−1} − θ_K)/Σ_k η_k with c_i = 0 (first round), m = [0.1, −0.1]
    model = _linear([1.0, 1.0])
    state = RecordDict()
    client = ControlVariateClient(model, _record({"weight": [[0.1, -0.1]]}), state, MOSWA_CLIENT_CONTROL, "server")
    model.weight.grad = torch.tensor([[1.0, 2.0]])
    client.hook([model.weight])
    assert model.weight.grad.flatten().tolist() == pytest.approx([1.1, 1.9])  # g − c_i + m
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.76, 0.52]]))  # moved by [0.24, 0.48]
    delta, new = client.finish(model, lr_sum=0.24)
    # [−0.1 + 0.24/0.24, 0.1 + 0.48/0.24] = [0.9, 2.1]; Δc_i = c_i⁺ − m (Algorithm 1 line 14)
    assert new["weight"].numpy().ravel().tolist() == pytest.approx([0.9, 2.1])
    assert delta["weight"].numpy().ravel().tolist() == pytest.approx([0.8, 2.2])
    assert state[MOSWA_CLIENT_CONTROL]["weight"].numpy().ravel().tolist() == pytest.approx([0.9, 2.1])


def _moswa_client_round(state: RecordDict, m: float, theta_end: float, lr_sum: float = 0.1) -> float:
    """One FedMoSWA client round from θ^{t−1} = 1 to ``theta_end``; returns the sent Δc_i."""
    model = _linear([1.0])
    client = ControlVariateClient(model, _record({"weight": [[m]]}), state, MOSWA_CLIENT_CONTROL, "server")
    with torch.no_grad():
        model.weight.fill_(theta_end)
    delta, _ = client.finish(model, lr_sum)
    return delta["weight"].numpy().item()


def test_fedmoswa_two_rounds_by_hand_with_partial_participation():
    # N = 3 clients, s = 2 per round (A, B then A, C), γ = 0.4 (the default), Σ_k η_k = 0.1.
    states = {name: RecordDict() for name in "ABC"}
    assert FedSwa(momentum_control=True).gamma == 0.4
    # Round 1, m = 0: c_A⁺ = 0.2/0.1 = 2, c_B⁺ = 0.1/0.1 = 1; Δc = c⁺ − m = 2, 1.
    deltas = [_moswa_client_round(states["A"], 0.0, 0.8), _moswa_client_round(states["B"], 0.0, 0.9)]
    assert deltas == pytest.approx([2.0, 1.0])
    m = moswa_control_update({"w": np.zeros(1)}, [{"w": np.array([d])} for d in deltas], 0.4)["w"].item()
    assert m == pytest.approx(0.6)  # 0 + 0.4·1.5
    # Round 2, m = 0.6: c_A⁺ = 2 − 0.6 + 0.3/0.1 = 4.4 → Δc_A = 3.8;
    # c_C⁺ = 0 − 0.6 + 0.05/0.1 = −0.1 → Δc_C = −0.7.
    deltas = [_moswa_client_round(states["A"], m, 0.7), _moswa_client_round(states["C"], m, 0.95)]
    assert deltas == pytest.approx([3.8, -0.7])
    m = moswa_control_update({"w": np.array([m])}, [{"w": np.array([d])} for d in deltas], 0.4)["w"].item()
    # m + γ·mean Δc = 0.6 + 0.4·1.55 = (1 − γ)·0.6 + γ·mean(4.4, −0.1) = 1.22; neither scaled by N/s
    # nor drifting with Σ(c_i⁺ − c_i) (which would give 0.6 + 0.4·1.15 = 1.06).
    assert m == pytest.approx(1.22)
    assert states["B"][MOSWA_CLIENT_CONTROL]["weight"].numpy().item() == pytest.approx(1.0)  # unsampled: kept


def _record(values: dict[str, list]) -> ArrayRecord:
    return ArrayRecord({k: torch.tensor(v) for k, v in values.items()})


# --- FedDyn -----------------------------------------------------------------------------

def test_feddyn_client_gradient_and_state_by_hand():
    model = _linear([1.0, 2.0])
    state = RecordDict()
    client = FedDynClient(model, alpha=0.5, state=state)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[2.0, 0.0]]))  # θ − θ^{t−1} = [1, −2]
    model.weight.grad = torch.tensor([[0.3, 0.3]])
    client.hook([model.weight])
    # g − h_k + α(θ − θ^{t−1}) with h_k = 0: [0.3 + 0.5, 0.3 − 1.0]
    assert model.weight.grad.flatten().tolist() == pytest.approx([0.8, -0.7])
    assert client.state_norm() == 0.0
    client.finish(model)
    # h_k ← 0 − α(θ_k − θ^{t−1}) = [−0.5, 1.0]
    assert state[FEDDYN_CLIENT_GRADIENT]["weight"].numpy().ravel().tolist() == pytest.approx([-0.5, 1.0])
    # Next round (global model back at [1, 2]): the stored term enters the gradient.
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
    again = FedDynClient(model, alpha=0.5, state=state)
    assert again.state_norm() == pytest.approx(math.hypot(0.5, 1.0))
    model.weight.grad = torch.zeros(1, 2)
    again.hook([model.weight])
    assert model.weight.grad.flatten().tolist() == pytest.approx([0.5, -1.0])  # −h_k at θ = θ^{t−1}


# --- MOON -------------------------------------------------------------------------------

def test_moon_contrastive_loss_by_hand():
    z = torch.tensor([[1.0, 0.0]])
    # sim(z, z_glob) = 1, sim(z, z_prev) = 0, τ = 0.5: −log(e²/(e² + e⁰)) = log(1 + e^−2)
    loss = contrastive_loss(z, torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 3.0]]), temperature=0.5)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-2)))


def test_moon_keeps_the_previous_local_model_in_the_client_state():
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10)
    state = RecordDict()
    objective = Moon(model, state, mu=1.0, temperature=0.5)
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    loss = objective.backward(model, x, y)
    # First round: the previous model is the global one, so ℓ_con = log 2 exactly.
    assert loss.item() == pytest.approx(F.cross_entropy(model(x), y).item() + math.log(2), rel=1e-5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1)
    objective.finish(model)
    stored = state[MOON_PREVIOUS_MODEL].to_torch_state_dict()
    assert all(torch.equal(stored[k], v) for k, v in model.state_dict().items())


# --- FedSAM / FedASAM -------------------------------------------------------------------

def test_sam_gradient_is_taken_at_the_perturbed_weights():
    model = _linear([3.0, 4.0])  # ‖w‖ = 5, g = w for ½‖w‖²
    objective = SharpnessAware(rho=0.5, inner=_HalfSquaredNorm())
    objective.backward(model, None, None)
    # ε = ρ g/‖g‖ = 0.1·[3, 4]; ∇L(w + ε) = w + ε = [3.3, 4.4]; w restored
    assert model.weight.grad.flatten().tolist() == pytest.approx([3.3, 4.4])
    assert model.weight.flatten().tolist() == pytest.approx([3.0, 4.0])


def test_asam_scales_the_perturbation_by_the_weights():
    model = _linear([3.0, 4.0])
    objective = SharpnessAware(rho=0.5, adaptive=True, eta=1.0, inner=_HalfSquaredNorm())
    objective.backward(model, None, None)
    # T = |w| + η = [4, 5]; T g = [12, 20], ‖T g‖ = √544; ε = ρ T² g/‖T g‖ = 0.5·[48, 100]/√544
    epsilon = 0.5 * np.array([48.0, 100.0]) / math.sqrt(544)
    assert model.weight.grad.numpy().ravel().tolist() == pytest.approx((np.array([3.0, 4.0]) + epsilon).tolist(), rel=1e-6)
    assert model.weight.flatten().tolist() == pytest.approx([3.0, 4.0])


# --- FedAlign ---------------------------------------------------------------------------

def test_transmitting_matrix_by_hand():
    # One sample, C_in = 1, C_out = 2, 2×1 spatial: T = f_in f_outᵀ / HW
    f_in = torch.tensor([[[[1.0], [2.0]]]])
    f_out = torch.tensor([[[[3.0], [4.0]], [[5.0], [6.0]]]])
    assert transmitting_matrix(f_in, f_out).tolist() == [[[(3 + 8) / 2, (5 + 12) / 2]]]


def test_power_iteration_matches_the_top_singular_value_of_an_svd():
    torch.manual_seed(0)
    matrices = torch.rand(5, 6, 4, dtype=torch.float64)  # positive entries: v = 1 is not orthogonal to the top vector
    expected = torch.linalg.svdvals(matrices)[:, 0]
    assert torch.allclose(top_singular_value(matrices, iterations=10), expected, rtol=1e-6)


def test_fedalign_term_vanishes_when_the_lipschitz_constants_agree():
    # At initialisation every residual branch is off and σ_S = σ_F: the term and its
    # gradient are 0 (not CE/0).
    ce = torch.tensor(2.0, requires_grad=True)
    term = scaled_lipschitz_loss(ce, torch.tensor(0.0, requires_grad=True), mu=0.45)
    term.backward()
    assert term.item() == 0.0 and ce.grad is None  # no contribution to the CE gradient either


def test_power_iteration_of_a_zero_matrix_is_zero_with_finite_gradients():
    matrices = torch.zeros(2, 3, 4, requires_grad=True)
    sigma = top_singular_value(matrices)
    sigma.sum().backward()
    assert sigma.abs().max().item() < 1e-5 and torch.isfinite(matrices.grad).all()


def test_fedalign_loss_scaling():
    ce = torch.tensor(2.0, requires_grad=True)
    lip = torch.tensor(0.5, requires_grad=True)
    term = scaled_lipschitz_loss(ce, lip, mu=0.45)
    assert term.item() == pytest.approx(0.45 * 2.0)  # value μ·CE
    term.backward()
    assert lip.grad.item() == pytest.approx(0.45 * 2.0 / 0.5)  # μ·CE/L_Lip
    assert ce.grad is None  # the factor CE.item()/L_Lip.item() is a constant: CE gets no extra gradient


def _fedalign_model_and_batch() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = build_model("resnet20-gn", (1, 8, 8), 10)
    for block in model.residual_blocks():  # switch the zero-initialised branches on: L_Lip > 0
        torch.nn.init.ones_(block.last_norm.weight)
    return model, torch.randn(6, 1, 8, 8), torch.arange(6)


def _cross_entropy_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    return grads


def test_fedalign_classifier_gradient_is_cross_entropys_alone():
    model, x, y = _fedalign_model_and_batch()
    expected = _cross_entropy_gradients(model, x, y)
    FedAlign(mu=0.45, width=0.25).backward(model, x, y)
    for name in ("classifier.weight", "classifier.bias"):
        torch.testing.assert_close(model.get_parameter(name).grad, expected[name], rtol=1e-5, atol=1e-7)


def test_fedalign_lipschitz_term_reaches_the_last_stage_only_through_the_slim_pass():
    # σ_F is computed from detached full-width features, so the last stage's weights outside
    # the slim slice (output channels ≥ ⌈ω_S·C⌉) get exactly CE's gradient, while the slice
    # itself gets CE's plus L_Lip's.
    model, x, y = _fedalign_model_and_batch()
    expected = _cross_entropy_gradients(model, x, y)
    FedAlign(mu=0.45, width=0.25).backward(model, x, y)
    conv = model.stages[-1][-1].conv1
    name = next(n for n, p in model.named_parameters() if p is conv.weight)
    kept = sliced_channels(conv.out_channels, 0.25)
    torch.testing.assert_close(conv.weight.grad[kept:], expected[name][kept:], rtol=1e-5, atol=1e-7)
    assert not torch.allclose(conv.weight.grad[:kept], expected[name][:kept], rtol=1e-3, atol=1e-6)
    # The stages before the last one are reached by CE only (f_{L−1} is detached for the slim pass).
    for n, p in model.named_parameters():
        if n.startswith(("stem.", "stages.0.", "stages.1.")):
            torch.testing.assert_close(p.grad, expected[n], rtol=1e-5, atol=1e-7)


def test_fedalign_trains_a_resnet_and_touches_only_its_weights():
    model, x, y = _fedalign_model_and_batch()
    loss = FedAlign(mu=0.45, width=0.25).backward(model, x, y)
    ce = F.cross_entropy(model(x), y).item()
    assert loss.item() == pytest.approx(ce * 1.45, rel=1e-5)  # CE + μ·CE
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(TypeError, match="slimmable"):
        FedAlign().backward(build_model("mlp", (1, 8, 8), 10), x, y)


# --- FedAlign study regularizers ---------------------------------------------------------

def test_mixup_loss_by_hand():
    model = nn.Linear(2, 2)
    x, y = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1])
    objective = Mixup(0.1, np.random.default_rng(3))
    loss = objective.backward(model, x, y, *objective.draws([2])[0])
    rng = np.random.default_rng(3)  # the same draws
    lam, pairing = rng.beta(0.1, 0.1), torch.from_numpy(rng.permutation(2))
    logits = model(lam * x + (1 - lam) * x[pairing])
    expected = lam * F.cross_entropy(logits, y) + (1 - lam) * F.cross_entropy(logits, y[pairing])
    assert loss.item() == pytest.approx(expected.item())


def test_stochastic_depth_rates_decay_linearly_and_are_reset():
    # The FedAlign authors' resnet_stochdepth.py: p from 1.0 at the first block to 0.9 at the last.
    assert drop_rates(5, 0.9) == pytest.approx([0.0, 0.025, 0.05, 0.075, 0.1])
    model = build_model("resnet20-gn", (1, 8, 8), 10)
    objective = StochasticDepth(model, 0.9)
    blocks = model.residual_blocks()
    assert len(objective.rates) == 9 and objective.rates[-1] == pytest.approx(0.1) and objective.rates[0] == 0.0
    assert objective.rates[1] == pytest.approx(0.1 / 8)
    assert [block for block, _ in objective.dropping] == blocks[1:]  # the first block (rate 0) draws nothing
    objective.backward(model, torch.randn(2, 1, 8, 8), torch.arange(2), *objective.draws([2])[0])
    assert all(block.branch_scale is not None for block in blocks[1:])
    objective.finish(model)
    assert all(block.branch_scale is None and block.drop_rate == 0.0 for block in blocks)


def test_gradaug_without_distillation_is_plain_cross_entropy():
    torch.manual_seed(0)
    model = build_model("resnet20-gn", (1, 8, 8), 10)
    x, y = torch.randn(4, 1, 8, 8), torch.arange(4)
    GradAug(2, 0.8, 0.0, np.random.default_rng(0)).backward(model, x, y)
    gradaug_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    assert all(torch.allclose(a, p.grad) for a, p in zip(gradaug_grads, model.parameters()))
    model.zero_grad()
    loss = GradAug(2, 0.8, 1.75, np.random.default_rng(0)).backward(model, x, y)
    assert loss.item() > F.cross_entropy(model(x), y).item()  # plus the sub-networks' KL terms


def test_gradaug_rounds_widths_and_resolutions_as_its_authors(monkeypatch):
    from clients.models.slimmable import sliced_channels
    from clients.objectives import gradaug

    # make_divisible(16·0.8 = 12.8, 8) = 16 (Basin's own rounding: 14); 64·0.9 = 57.6 → 56.
    assert (sliced_channels(16, 0.8, 8), sliced_channels(16, 0.8)) == (16, 14)
    assert sliced_channels(64, 0.9, 8) == 56 and sliced_channels(64, 0.85, 8) == 56 and sliced_channels(32, 0.8, 8) == 24
    assert {round(32 * s) for s in gradaug.RESOLUTION_SCALES} == {32, 28, 24, 20}  # the authors' main.py
    model = build_model("resnet20-gn", (1, 8, 8), 10)
    widths = []
    real = gradaug.slimmable_width

    def recording(module, width, divisor=0):
        widths.append(sliced_channels(16, width, divisor))
        return real(module, width, divisor)

    monkeypatch.setattr(gradaug, "slimmable_width", recording)
    GradAug(1, 0.8, 1.75, np.random.default_rng(0)).backward(model, torch.randn(2, 1, 8, 8), torch.arange(2))
    assert widths == [16]  # a 16-channel layer of the ω_b = 0.8 sub-network keeps all 16


def test_gradaug_always_trains_the_smallest_width_widest_first():
    assert GradAug(1, 0.8, 1.75, np.random.default_rng(0)).subnet_widths() == [0.8]
    widths = GradAug(3, 0.8, 1.75, np.random.default_rng(0)).subnet_widths()
    drawn = sorted(np.random.default_rng(0).uniform(0.8, 1.0, 2).tolist(), reverse=True)
    assert widths == [*drawn, 0.8]


@pytest.mark.parametrize("after_clip, expected", [(False, [-4 / math.sqrt(32), -4 / math.sqrt(32)]), (True, [-1.6, -0.8])])
def test_official_fedmoswa_adds_its_correction_after_clipping(after_clip, expected):
    # g = ∇½‖w − (−3, −4)‖²… at w = 0 is (3, 4) (norm 5); correction m − c_i = (1, 0); clip 1, lr 1.
    # Before clipping (paper, SCAFFOLD): clip((4, 4)) = (4, 4)/√32. After (official code): (0.6, 0.8) + (1, 0).
    class _Pull(LocalObjective):
        def backward(self, model, x, y):
            loss = 0.5 * ((model.weight - torch.tensor([[-3.0, -4.0]])) ** 2).sum()
            loss.backward()
            return loss.detach()

    model = _linear([0.0, 0.0])
    content = RecordDict({
        "config": ConfigRecord({"lr": 1.0, "local-epochs": 1, "batch-size": 1, "momentum": 0.0, "weight-decay": 0.0,
                                "grad-clip": 1.0, "local-steps": 1, protocol.CONTROL_AFTER_CLIP: after_clip}),
        protocol.MOSWA_SERVER_CONTROL: _record({"weight": [[1.0, 0.0]]}),
    })
    local_round = LocalRound(model, content, RecordDict(), np.random.default_rng(0), NO_CLIENT)
    local_round.objective = _Pull()
    local_round.train(model, torch.zeros(1, 2), torch.zeros(1, dtype=torch.long), torch.Generator().manual_seed(0))
    assert model.weight.flatten().tolist() == pytest.approx(expected)


@pytest.mark.usefixtures("server_identity")  # tests/conftest.py
def test_only_fedalign_clips_its_gradients_in_the_fedalign_study():
    study = {"model": "resnet20-gn"}
    clips = {}
    for method in ("fedalign", "fedavg", "fedprox", "moon"):
        strategy = bound_strategy({**study, "strategy": method})
        messages = strategy.configure_train(1, ArrayRecord({"w": Array(np.zeros(1))}), ConfigRecord({"grad-clip": 0.0}),
                                            FakeGrid([100, 101, 102]))
        clips[method] = {float(m.content["config"]["grad-clip"]) for m in messages}
    assert clips == {"fedalign": {10.0}, "fedavg": {0.0}, "fedprox": {0.0}, "moon": {0.0}}
