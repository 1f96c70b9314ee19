"""FedLC's loss against values computed by hand, and the client's own counts through the
captured step's code (its static mode, on the CPU)."""

import math

import numpy as np
import torch
from basin_fedlc.objective import LogitCalibration, calibration, fedlc_objective

from clients.client_info import ClientInfo
from clients.training import LocalTrainingConfig, train_local


class Linear(torch.nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.classifier = torch.nn.Linear(2, 3, bias=False)
        with torch.no_grad():
            self.classifier.weight.copy_(torch.tensor(weight))

    def forward(self, x):
        return self.classifier(x)


def test_the_calibration_is_tau_over_the_fourth_root_of_the_counts_and_absent_classes_are_never_predicted():
    assert calibration(torch.tensor([16, 1, 0]), 2.0).tolist() == [1.0, 2.0, math.inf]
    assert calibration(torch.tensor([16, 0]), 0.0).tolist() == [0.0, 0.0]  # τ = 0: plain cross-entropy


def test_the_loss_of_one_example_is_the_hand_computed_value():
    # Logits (1, 0, 2) for label 0; counts (16, 1, 0), τ = 1: calibrated (1 − ½, 0 − 1, −∞) = (½, −1, −∞);
    # loss = −log(e^{½} / (e^{½} + e^{−1})) = log(1 + e^{−3/2}).
    model = Linear([[1.0, 0.0], [0.0, 0.0], [2.0, 0.0]])
    objective = LogitCalibration(1.0, torch.device("cpu"))
    objective.see_client(ClientInfo(partition_id=0, num_examples=17, label_counts=(16, 1, 0), num_classes=3, dataset="toy",
                                    server_round=1))
    loss = objective.backward(model, torch.tensor([[1.0, 0.0]]), torch.tensor([0]))
    assert abs(loss.item() - math.log(1 + math.exp(-1.5))) < 1e-6
    assert torch.isfinite(model.classifier.weight.grad).all()
    assert model.classifier.weight.grad[2].abs().sum() == 0  # the absent class takes no probability mass


def _round(model, counts, mode):
    """One round of a client with ``counts`` (its labels) in ``mode``: its mean loss."""
    y = torch.cat([torch.full((n,), c) for c, n in enumerate(counts)])
    x = torch.randn(len(y), 2, generator=torch.Generator().manual_seed(0))
    objective = fedlc_objective({"fedlc-tau": 1.0}, model, None, None, None)
    objective.see_client(ClientInfo.of(y, 3))
    config = LocalTrainingConfig(lr=0.0, local_epochs=1, batch_size=len(y), momentum=0.0, weight_decay=0.0, grad_clip=0.0)
    return train_local(model, x, y, config, torch.Generator().manual_seed(0), objective=objective, mode=mode).mean_loss, x, y


def test_two_clients_get_their_own_losses_through_the_captured_steps_code():
    """The second client's round reuses the first one's step (static buffers, as a CUDA graph
    replays): its loss is its own counts', not the first client's."""
    from clients import client_step

    client_step._PROCESS_STEPS.clear()
    model = Linear([[1.0, -1.0], [0.5, 2.0], [-1.0, 0.0]])
    first, _, _ = _round(model, (4, 2, 2), "static")
    second, x, y = _round(model, (2, 6, 0), "static")  # lr 0: the model is unchanged
    expected = torch.nn.functional.cross_entropy(model(x) - calibration(torch.tensor([2, 6, 0]), 1.0), y).item()
    assert abs(second - expected) < 1e-6
    assert abs(first - second) > 1e-3
    assert np.isclose(second, _round(model, (2, 6, 0), "eager")[0])


def test_on_the_char_lstm_the_offsets_calibrate_the_class_axis_of_every_position():
    """Shakespeare's 82 classes over 80 positions: (N, 82, 80) logits; each position's logits
    less the client's per-class offsets, by hand (offsets along the time axis were a shape error)."""
    from clients.models import build_model

    torch.manual_seed(0)
    model = build_model("char-lstm", (80,), 82)
    y = torch.randint(0, 82, (2, 80))
    y[1, 70:] = -100  # padding is no target
    x = torch.randint(0, 82, (2, 80))
    objective = LogitCalibration(1.0, torch.device("cpu"))
    objective.see_client(ClientInfo.of(torch.arange(82).repeat(2), 82))  # every class twice
    loss = objective.backward(model, x, y)
    expected = torch.nn.functional.cross_entropy(model(x) - 2 ** -0.25, y)
    assert torch.isclose(loss, expected.detach(), rtol=1e-6)
