"""FedDecorr's loss against values computed by hand."""

import math

import torch
from basin_feddecorr.objective import FedDecorr, decorrelation_loss


def test_the_decorrelation_loss_of_a_small_batch_is_the_hand_computed_value():
    # Three samples, two dimensions. Column 1: 1, 2, 3 → standardised −1, 0, 1 (unbiased
    # variance 1). Column 2: 2, 2, 5 → mean 3, variance ((1 + 1 + 4)/2) = 3, standardised
    # −1/√3, −1/√3, 2/√3. Off-diagonal of ẐᵀẐ: 1/√3 + 0 + 2/√3 = √3, both entries.
    z = torch.tensor([[1.0, 2.0], [2.0, 2.0], [3.0, 5.0]], dtype=torch.float64)
    expected = (math.sqrt(3) ** 2) / 3  # mean of the two squared entries (3 each), over N = 3
    assert abs(decorrelation_loss(z).item() - expected) < 1e-7  # ε = 1e-8 under the root moves the 9th digit


def test_uncorrelated_dimensions_cost_nothing_and_one_sample_costs_nothing():
    z = torch.tensor([[1.0, 1.0], [-1.0, 1.0], [1.0, -1.0], [-1.0, -1.0]])  # ẐᵀẐ is diagonal
    assert abs(decorrelation_loss(z).item()) < 1e-12
    assert decorrelation_loss(torch.ones(1, 4)).item() == 0.0


def test_the_objective_adds_beta_times_the_decorrelation_to_cross_entropy():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.features = torch.nn.Linear(3, 2)
            self.classifier = torch.nn.Linear(2, 4)

        def represent(self, x):
            return self.features(x)

    torch.manual_seed(0)
    model, x, y = Model(), torch.randn(5, 3), torch.tensor([0, 1, 2, 3, 0])
    loss = FedDecorr(0.5).backward(model, x, y)
    z = model.represent(x)
    expected = torch.nn.functional.cross_entropy(model.classifier(z), y) + 0.5 * decorrelation_loss(z)
    assert torch.allclose(loss, expected.detach())
    assert model.features.weight.grad is not None
