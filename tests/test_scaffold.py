"""SCAFFOLD's control-variate arithmetic (client option II and server update), by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, RecordDict

from clients.control_variates import ControlVariateClient, client_control_update
from clients.protocol import SCAFFOLD_CLIENT_CONTROL as STATE_KEY
from strategies.scaffold import server_control_update


def test_client_control_option_ii_by_hand():
    # c_i⁺ = c_i − c + (w^t − w_i)/(K·η) with K = 4, η = 0.5: (w^t − w_i)/2
    updated = client_control_update(
        client_control={"w": torch.tensor([1.0, 0.0])},
        server_control={"w": torch.tensor([0.5, 0.5])},
        global_weights={"w": torch.tensor([2.0, 2.0])},
        local_weights={"w": torch.tensor([1.0, 3.0])},
        lr_sum=4 * 0.5,
    )
    assert updated["w"].tolist() == [1.0 - 0.5 + 0.5, 0.0 - 0.5 - 0.5]


def test_server_control_by_hand():
    # c ← c + (|S|/N)·mean Δc_i with |S| = 2 of N = 4: c + (Δ1 + Δ2)/4
    control = server_control_update(
        {"w": np.array([1.0, 1.0])}, [{"w": np.array([2.0, 0.0])}, {"w": np.array([0.0, 4.0])}], num_clients=4
    )
    assert control["w"].tolist() == [1.5, 2.0]


def test_client_corrects_gradients_and_keeps_its_control_across_rounds():
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 1.0]]))
    state = RecordDict()
    server = ArrayRecord({"weight": torch.tensor([[0.25, -0.25]])})
    client = ControlVariateClient(model, server, state, STATE_KEY)
    assert client.state_norm() == 0.0  # first round: c_i = 0
    model.weight.grad = torch.zeros(1, 2)
    client.hook([model.weight])
    assert model.weight.grad.tolist() == [[0.25, -0.25]]  # g − c_i + c
    with torch.no_grad():
        model.weight.sub_(torch.tensor([[0.5, 1.0]]))  # pretend 2 steps of lr 0.5 moved w
    delta, new_control = client.finish(model, lr_sum=2 * 0.5)
    # c_i⁺ = 0 − c + (w^t − w)/(2·0.5) = [−0.25 + 0.5, 0.25 + 1.0]
    assert delta["weight"].numpy().tolist() == [[0.25, 1.25]]
    assert new_control["weight"].numpy().tolist() == [[0.25, 1.25]]  # c_i was 0
    again = ControlVariateClient(model, server, state, STATE_KEY)  # the next round finds c_i in the state
    assert again.state_norm() == pytest.approx(float(np.hypot(0.25, 1.25)))
    assert STATE_KEY in state
