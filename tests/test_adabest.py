"""AdaBest (Varno et al., ECCV 2022): the client bias decaying with the rounds since a client's
last round, the server update by hand and through Messages with checkpointed state."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import RecordDict
from torch import nn

from clients import protocol
from strategies.checkpoint import load_checkpoint, save_checkpoint
from tests.fakes import COHORT
from tests.tiny_rounds import bound, configure, f32, replies

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py


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

    previous = {"w": f32([1.0, 1.0]), "n": np.array([3])}
    clients = [{"w": f32([2.0, 0.0]), "n": np.array([4])}, {"w": f32([0.0, 3.0]), "n": np.array([8])}]
    # θ̄ = (1·[2, 0] + 3·[0, 3])/4 = [0.5, 2.25]; θ = θ̄ − 0.5·(θ̄⁻ − θ̄) = [0.5, 2.25] − 0.5·[0.5, −1.25]
    theta, average = adabest_server_update(previous, clients, [1.0, 3.0], 0.5)
    np.testing.assert_allclose(average["w"], [0.5, 2.25])
    np.testing.assert_allclose(theta["w"], [0.25, 2.875])
    assert theta["n"].tolist() == average["n"].tolist() == [7]


def test_adabest_two_rounds_through_messages_and_state(tmp_path):
    from strategies.adabest import AdaBest, adabest_server_update

    strategy = bound(AdaBest(mu=0.02, beta=0.5, variant="official-code", **COHORT))
    theta0 = f32([1.0, -1.0])
    first = configure(strategy, 1, theta0)
    config = first[0].content["config"]
    assert (config[protocol.ADABEST_MU], config[protocol.ADABEST_OFFICIAL_CODE], config[protocol.ADABEST_MEAN_EXAMPLES_PER_STEP]) \
        == (0.02, True, 0.0)  # m̄ = 0 before any reply
    model_of = lambda p: theta0 + f32([0.1 * (p + 1), -0.3])  # noqa: E731
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
