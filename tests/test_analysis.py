"""The analysis tools' arithmetic on analytic cases (ANALYSIS.md §7), and saved models."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from clients.training import evaluate
from experiments.analysis.decomposition import bias_terms, ensemble_gap, error_vs_count
from experiments.analysis.hessian import (
    HessianOperator,
    hessian_vector_product,
    hutchinson,
    pair_indicators,
    power_iteration,
)
from experiments.analysis.inputs import ThetaSpace
from experiments.analysis.interpolation import interpolation_curve, interpolation_thetas
from experiments.analysis.landscape import Plane, evaluate_plane, grid_axes, plane_through
from experiments.analysis.stability import curve_summary, round_to_round_noise
from strategies.indicators import client_distances, linear_cka, locality, mean_pairwise_cka, round_indicators
from strategies.model_store import discard_rounds_after, load_round_models, save_round_models, saved_rounds, saves_round

# --- §7.1 the plane through three models ----------------------------------------------


def test_plane_through_unit_triangle_has_unit_axes_and_model_coordinates():
    w1, w2, w3 = torch.tensor([0.0, 0.0]), torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    plane = plane_through(w1, w2, w3)
    torch.testing.assert_close(plane.u_hat, torch.tensor([1.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(plane.v_hat, torch.tensor([0.0, 1.0], dtype=torch.float64))
    coordinates = [plane.coordinates(w.double()) for w in (w1, w2, w3)]
    assert coordinates == [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0)]
    assert np.allclose(np.mean(coordinates, axis=0), [1 / 3, 1 / 3])  # the white cross


def test_plane_coordinates_are_euclidean_not_divided_by_the_squared_norm():
    """Workshop App. A prints u/‖u‖²; with unit vectors w2 = (2, 0) sits at (2, 0), not (1, 0)."""
    plane = plane_through(torch.tensor([0.0, 0.0, 0.0]), torch.tensor([2.0, 0.0, 0.0]), torch.tensor([1.0, 3.0, 0.0]))
    assert plane.coordinates(torch.tensor([2.0, 0.0, 0.0], dtype=torch.float64)) == (2.0, 0.0)
    assert plane.coordinates(torch.tensor([1.0, 3.0, 0.0], dtype=torch.float64)) == (1.0, 3.0)


def test_landscape_of_a_quadratic_bowl_is_the_distance_to_its_centre():
    centre = torch.tensor([0.3, 0.6], dtype=torch.float64)
    plane = plane_through(torch.tensor([0.0, 0.0]), torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))
    xs, ys = grid_axes([(0, 0), (1, 0), (0, 1)], points=21)
    assert (xs[0], xs[-1], ys[0], ys[-1]) == (-0.2, 1.2, -0.2, 1.2)  # plane.py's [−0.2, 1.2]
    values = evaluate_plane(lambda thetas: {"loss": ((thetas - centre) ** 2).sum(dim=1).numpy()}, plane, xs, ys, 4)
    grid_y, grid_x = np.meshgrid(ys.numpy(), xs.numpy(), indexing="ij")
    np.testing.assert_allclose(values["loss"], (grid_x - 0.3) ** 2 + (grid_y - 0.6) ** 2, atol=1e-12)


def test_grid_keeps_every_model_inside_the_window():
    xs, ys = grid_axes([(0.0, 0.0), (1.0, 0.0), (1.8, 0.5)], points=5)
    assert xs[0] < 0 and xs[-1] > 1.8 and ys[0] < 0 and ys[-1] > 0.5


def test_three_models_on_one_line_span_no_plane():
    with pytest.raises(ValueError, match="one line"):
        plane_through(torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0]), torch.tensor([3.0, 3.0]))
    with pytest.raises(ValueError, match="identical"):
        plane_through(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))


# --- §7.2 interpolation -------------------------------------------------------------------


def tiny_space(seed: int = 0) -> tuple[ThetaSpace, nn.Module]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    return ThetaSpace(model), model


def test_interpolation_between_identical_models_is_flat():
    space, model = tiny_space()
    theta = space.theta(model.state_dict())
    x, y = torch.randn(50, 4), torch.randint(0, 3, (50,))
    curve = interpolation_curve(space, theta, theta, np.linspace(-0.5, 1.5, 9), x, y)
    assert np.ptp(curve["loss"]) < 1e-6 and np.ptp(curve["error"]) == 0


def test_interpolation_on_a_quadratic_is_the_parabola_with_the_closed_form_minimum():
    rng = np.random.default_rng(1)
    m = rng.normal(size=(3, 3))
    a = torch.tensor(m @ m.T + np.eye(3))
    c, wa, wb = (torch.tensor(rng.normal(size=3)) for _ in range(3))
    alphas = np.linspace(-3, 3, 6001)
    thetas = interpolation_thetas(wa, wb, alphas)
    values = 0.5 * torch.einsum("bi,ij,bj->b", thetas - c, a, thetas - c)
    direction = wb - wa
    best = float((c - wa) @ a @ direction / (direction @ a @ direction))
    assert abs(alphas[int(values.argmin())] - best) < 1e-3
    np.testing.assert_allclose(thetas[0].numpy(), ((1 + 3) * wa - 3 * wb).numpy())


@pytest.mark.parametrize("models_per_pass", [1, 2])
def test_batched_evaluation_matches_the_training_loops_evaluate(models_per_pass):
    space, model = tiny_space(3)
    space.models_per_pass = models_per_pass
    x, y = torch.randn(70, 4), torch.randint(0, 3, (70,))
    other = space.theta(model.state_dict()) * 0.5
    loss, error = space.evaluate(torch.stack([space.theta(model.state_dict()), other]), x, y, batch_size=16)
    reference_loss, reference_accuracy = evaluate(model, x, y)
    assert loss[0] == pytest.approx(reference_loss, rel=1e-5) and error[0] == pytest.approx(100 * (1 - reference_accuracy))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    assert loss[1] == pytest.approx(evaluate(model, x, y)[0], rel=1e-5)


# --- §7.4 Lemma 1, §7.5 decomposition, §7.6 locality ---------------------------------------


class Squared(nn.Module):
    """f_w(x) = (wᵀx)²."""

    def __init__(self, d: int):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return ((x @ self.w) ** 2).unsqueeze(1)


def test_lemma_1_fma_equals_the_ensemble_for_a_linear_model_and_differs_by_second_order_otherwise():
    torch.manual_seed(0)
    thetas, p, x = torch.randn(3, 4), [1.0, 2.0, 5.0], torch.randn(20, 4)
    linear = ThetaSpace(nn.Linear(4, 1, bias=False))
    assert ensemble_gap(linear, thetas, p, x) < 1e-10
    weights = torch.tensor(p, dtype=torch.float64) / sum(p)
    deltas = thetas.double() - weights @ thetas.double()
    expected = (weights @ ((x.double() @ deltas.T) ** 2).T) ** 2  # (Σ_k p_k (Δ_kᵀx)²)² per x
    assert ensemble_gap(ThetaSpace(Squared(4)), thetas, p, x) == pytest.approx(float(expected.mean()), rel=1e-4)


def test_bias_terms_by_hand():
    """K = 2, n = 2, one output: f_1 = (0.5, 0.2), f_2 = (0.1, 0.4), y = (1, 0), D_1 = {x0}, D_2 = {x1}."""
    predictions = torch.tensor([[[0.5], [0.2]], [[0.1], [0.4]]], dtype=torch.float64)
    targets = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    membership = torch.tensor([[True, False], [False, True]])
    terms = bias_terms(predictions, targets, membership, [1.0, 1.0])
    assert terms["train-bias"] == pytest.approx((0.25**2 + 0.2**2) / 2)
    assert terms["heter-bias"] == pytest.approx((0.45**2 + 0.1**2) / 2)
    assert terms["bias"] == pytest.approx((0.7**2 + 0.3**2) / 2)
    torch.testing.assert_close(terms["client-train-mse"], torch.tensor([0.25, 0.16], dtype=torch.float64))
    torch.testing.assert_close(terms["client-heter-mse"], torch.tensor([0.04, 0.81], dtype=torch.float64))


def test_identical_clients_have_no_locality_and_the_bias_term_is_their_mse():
    rng = np.random.default_rng(0)
    probabilities = torch.softmax(torch.tensor(rng.normal(size=(30, 4))), dim=1)
    targets = torch.nn.functional.one_hot(torch.tensor(rng.integers(0, 4, 30)), 4).double()
    membership = torch.tensor(rng.permutation(np.repeat([[True], [False], [False]], 10, axis=1).ravel()).reshape(1, 30))
    membership = torch.cat([membership, ~membership])
    terms = bias_terms(torch.stack([probabilities, probabilities]), targets, membership, [3.0, 7.0])
    assert terms["bias"] == pytest.approx(float(((targets - probabilities) ** 2).sum(dim=1).mean()))
    same = torch.ones(3, 5)
    assert locality(same, [1, 2, 3]) == 0


def test_locality_of_two_clients_at_plus_and_minus_e1_is_one():
    assert locality(torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64), [1, 1]) == 1.0
    # Weighted FMA: (3·e1 − 1·e1)/4 = 0.5·e1, so the distances are 0.5 and 1.5.
    torch.testing.assert_close(client_distances(torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64), [3, 1]),
                               torch.tensor([0.5, 1.5], dtype=torch.float64))


def test_error_vs_count_averages_growing_subsets_and_ends_with_the_full_average():
    space, model = tiny_space(5)
    thetas = torch.stack([space.theta(model.state_dict()) + 0.1 * torch.randn(space.dimension) for _ in range(4)])
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    table = error_vs_count(space, thetas, x, y, repeats=2, seed=0)
    assert table["models"].tolist() == [1, 2, 3, 4] * 2
    full = space.evaluate(thetas.mean(dim=0, keepdim=True), x, y)[0][0]
    assert table[table["models"] == 4]["loss"].to_numpy() == pytest.approx([full, full], rel=1e-5)
    assert set(table[table["models"] == 1]["loss"].round(6)) <= set(np.round(space.evaluate(thetas, x, y)[0], 6))


# --- §7.7 CKA -------------------------------------------------------------------------------


def test_linear_cka_invariances_and_range():
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.normal(size=(200, 5)))
    q, _ = np.linalg.qr(rng.normal(size=(5, 5)))
    assert linear_cka(x, x) == pytest.approx(1.0)
    assert linear_cka(x, -2.5 * x @ torch.tensor(q) + torch.tensor(rng.normal(size=5))) == pytest.approx(1.0)
    independent = linear_cka(torch.tensor(rng.normal(size=(5000, 3))), torch.tensor(rng.normal(size=(5000, 3))))
    assert 0 <= independent < 0.01
    related = linear_cka(x, x + torch.tensor(rng.normal(size=(200, 5))))
    assert 0 < related < 1
    assert mean_pairwise_cka([x, x, x]) == pytest.approx(1.0) and math.isnan(mean_pairwise_cka([x]))


def test_round_indicators_of_a_cohort():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    states = [{**state, "bias": state["bias"] + shift} for shift in (-1.0, 1.0)]
    row = round_indicators(model, states, [1, 1], torch.randn(30, 3))
    # Each client is 1 away from the FMA in both bias entries: ‖(±1, ±1)‖ = √2.
    assert row["locality"] == pytest.approx(math.sqrt(2)) and row["locality-mean"] == pytest.approx(math.sqrt(2))
    assert row["client-cka"] == pytest.approx(1.0)  # the outputs differ by a constant shift
    states[1] = {**state, "weight": state["weight"] * np.array([[1.0, -2.0, 0.5], [0.0, 1.0, 3.0]])}
    assert round_indicators(model, states, [1, 1], torch.randn(30, 3))["client-cka"] < 0.99


# --- §7.8 Hessian tools, §7.9 H_N/H_D, §7.10 eigen-surface ---------------------------------


def quadratic_hvp(a: torch.Tensor, sizes: list[int]):
    """H v of L(θ) = ½θᵀAθ with θ split into tensors of ``sizes``."""
    def hvp(v):
        return list((a @ torch.cat([t.reshape(-1) for t in v])).split(sizes))

    return hvp


def test_power_iteration_finds_the_largest_magnitude_eigenvalues_signed_with_deflation():
    a = torch.diag(torch.tensor([1.0, -5.0, 3.0, 0.5], dtype=torch.float64))
    like = [torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)]
    values, vectors = power_iteration(quadratic_hvp(a, [2, 2]), like, top_n=2, max_iter=500, tol=1e-10)
    # pyhessian normalises by ‖v‖ + 1e-6: the estimates are (1 − 2e-6)·λ.
    assert values == pytest.approx([-5.0, 3.0], rel=1e-5)
    first = torch.cat(vectors[0])
    assert abs(float(first[1])) == pytest.approx(1.0, abs=1e-4)


def test_hutchinson_is_exact_on_a_diagonal_quadratic_and_gives_block_traces():
    a = torch.diag(torch.tensor([2.0, -1.0, 4.0], dtype=torch.float64))
    like = [torch.zeros(1, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)]
    result = hutchinson(quadratic_hvp(a, [1, 2]), like, diagonal=True)
    assert result["trace"] == 5.0 and result["samples"] == 2  # every sample is exact: stops at the second
    np.testing.assert_allclose(result["block-traces"], [2.0, 3.0])
    np.testing.assert_allclose(result["diagonal"], [2.0, -1.0, 4.0])


def test_block_traces_of_a_coupled_pair_average_to_the_diagonal_blocks():
    a = torch.tensor([[2.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    like = [torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)]
    result = hutchinson(quadratic_hvp(a, [1, 1]), like, max_iter=4000, tol=0.0, seed=3)
    assert result["samples"] == 4000
    np.testing.assert_allclose(result["block-traces"], [2.0, 3.0], atol=0.05)
    assert result["trace"] == pytest.approx(5.0, abs=0.1)


def test_hessian_vector_product_on_a_tiny_mlp_matches_the_full_hessian():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.randint(0, 2, (8,))
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def loss_of(theta):
        params = dict(zip(names, [t.reshape(s) for t, s in zip(theta.split([s.numel() for s in shapes]), shapes)]))
        return nn.functional.cross_entropy(torch.func.functional_call(model, params, (x,)), y)

    full = torch.autograd.functional.hessian(loss_of, flat)
    v = torch.randn(len(flat), dtype=torch.float64)
    pieces = [t.reshape(s) for t, s in zip(v.split([s.numel() for s in shapes]), shapes)]
    product = hessian_vector_product(nn.functional.cross_entropy(model(x), y), list(model.parameters()), pieces)
    torch.testing.assert_close(torch.cat([p.reshape(-1) for p in product]), full @ v)
    operator = HessianOperator(model, x, y, batch_size=8, batches=10, fixed_batches=True)
    torch.testing.assert_close(torch.cat([p.reshape(-1) for p in operator(pieces)]), full @ v)


def test_hn_hd_of_the_worked_pair_in_both_conventions():
    result = pair_indicators([np.array([1.0, 0.0]), np.array([0.0, 2.0])])
    assert (result["hn-pairs"], result["hd-pairs"]) == (1.0, 0.0)
    assert (result["hn-code"], result["hd-code"]) == (0.5, 0.5)
    same = pair_indicators([np.array([1.0, 2.0])] * 3)
    assert same["hn-pairs"] == 0 and same["hd-pairs"] == pytest.approx(1.0)


def test_eigen_surface_at_a_minimiser_is_the_exact_paraboloid():
    a = torch.diag(torch.tensor([4.0, 1.0, 0.5], dtype=torch.float64))
    minimiser = torch.zeros(3, dtype=torch.float64)
    like = [torch.zeros(3, dtype=torch.float64)]
    values, vectors = power_iteration(quadratic_hvp(a, [3]), like, top_n=2, max_iter=500, tol=1e-12)
    plane = Plane(minimiser, torch.cat(vectors[0]), torch.cat(vectors[1]))
    axis = torch.linspace(-1, 1, 5, dtype=torch.float64)
    z = evaluate_plane(lambda t: {"loss": (0.5 * torch.einsum("bi,ij,bj->b", t, a, t)).numpy()}, plane, axis, axis)["loss"]
    grid_b, grid_a = np.meshgrid(axis.numpy(), axis.numpy(), indexing="ij")
    np.testing.assert_allclose(z, 0.5 * (values[0] * grid_a**2 + values[1] * grid_b**2), atol=1e-5)
    np.testing.assert_allclose(values, [4.0, 1.0], rtol=1e-5)


# --- stability ------------------------------------------------------------------------------


def test_round_to_round_noise_and_curve_summary_by_hand():
    accuracy = [0.1, 0.3, 0.2, 0.4, 0.4]  # differences 0.2, −0.1, 0.2, 0.0
    noise = round_to_round_noise(accuracy, window=2)
    assert np.isnan(noise[:2]).all()
    np.testing.assert_allclose(noise[2:], [0.15, 0.15, 0.1])
    summary = curve_summary(accuracy, last=2, window=2)
    assert summary["last-mean"] == pytest.approx(0.4) and summary["last-std"] == 0
    assert summary["noise"] == pytest.approx(0.125)


# --- saved models -----------------------------------------------------------------------------


def test_which_rounds_save_models():
    config = {"save-models-every": 4, "save-models-last": 2, "num-rounds": 10}
    assert [r for r in range(1, 11) if saves_round(config, r)] == [4, 8, 9, 10]
    assert not any(saves_round({**config, "save-models-every": 0}, r) for r in range(1, 11))
    assert [r for r in range(1, 11) if saves_round({**config, "save-models-last": 0, "save-models-every": 3}, r)] == [3, 6, 9, 10]


def test_saved_models_round_trip_and_a_resume_discards_later_rounds(tmp_path):
    base = {"w": np.arange(3, dtype=np.float32)}
    clients = {7: {"w": np.ones(3, dtype=np.float32)}, 2: {"w": np.zeros(3, dtype=np.float32)}}
    for server_round in (2, 4, 6):
        save_round_models(tmp_path, server_round, base, None if server_round == 2 else base, clients, {7: 30.0, 2: 10.0})
    assert saved_rounds(tmp_path) == [2, 4, 6]
    loaded = load_round_models(tmp_path, 4)
    assert list(loaded["clients"]) == [2, 7] and loaded["client-weights"] == {2: 10.0, 7: 30.0}
    assert torch.equal(loaded["averaged"]["w"], torch.arange(3.0)) and load_round_models(tmp_path, 2)["averaged"] is None
    discard_rounds_after(tmp_path, 3)
    assert saved_rounds(tmp_path) == [2]
    with pytest.raises(FileNotFoundError, match="saved rounds: 2"):
        load_round_models(tmp_path, 4)



def test_a_wima_runs_base_curve_has_its_own_entry_and_identical_curves_stay_visible():
    """The WIMA run's base model is the FedAvg run of the same seed, bit for bit: drawn
    under FedAvg's name and colour it hid that curve (or hid under it)."""
    import matplotlib.pyplot as plt

    from experiments.analysis.stability import plot_stability

    rounds, accuracy = np.arange(1, 6), np.array([0.2, 0.4, 0.5, 0.6, 0.65])
    curves = [{"label": "fedavg", "averaged": False, "rounds": rounds, "accuracy": accuracy},
              {"label": "fedavg+wima", "averaged": True, "rounds": rounds, "accuracy": accuracy + 0.01},
              {"label": "fedavg+wima: base model", "averaged": False, "rounds": rounds, "accuracy": accuracy}]
    figure = plot_stability(curves, window=2, title="t")
    top = figure.axes[0]
    lines = {line.get_label(): line for line in top.lines}
    assert set(lines) == {"fedavg", "fedavg+wima", "fedavg+wima: base model"}
    same = lines["fedavg"], lines["fedavg+wima: base model"]
    assert same[0].get_color() != same[1].get_color() and same[0].get_linewidth() > same[1].get_linewidth()
    plt.close(figure)
