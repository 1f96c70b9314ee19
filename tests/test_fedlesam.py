"""FedLESAM (Fan et al., ICML 2024): the perturbation from the client's stored global model
(the paper) or the last global update (the authors' code), and its server's mean."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from torch import nn

from clients import protocol
from clients.local_round import LocalRound
from tests.fakes import COHORT, NO_CLIENT, FakeGrid, bound_strategy, train_reply
from tests.tiny_rounds import bound, configure

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py


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
    local_round = LocalRound(model, content, state, np.random.default_rng(0), NO_CLIENT)
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


def test_fedlesam_server_takes_the_uniform_mean_by_default():
    """FedLESAM's authors' server/server.py: the uniform mean of the client models; samples: n_i-weighted."""
    means = {}
    for weighting in ("uniform", "samples"):
        strategy = bound_strategy({"strategy": "fedlesam", "fedlesam-weighting": weighting})
        strategy.configure_train(1, ArrayRecord({"w": Array(np.zeros(1))}), ConfigRecord(), FakeGrid([100, 101, 102]))
        arrays, _ = strategy.aggregate_train(1, [train_reply(100 + i, [w], n) for i, (w, n) in enumerate([(1.0, 1), (2.0, 1), (6.0, 2)])])
        means[weighting] = arrays["w"].numpy()[0]
    assert means == {"uniform": pytest.approx(3.0), "samples": pytest.approx(15.0 / 4)}
