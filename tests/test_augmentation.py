"""On-device random crop (padding 4) and horizontal flip (clients/augmentation.py)."""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms import functional as TF

from clients.augmentation import crop_flip
from clients.local_round import batch_augmentation, training_config
from clients.models import build_model
from clients.training import train_local


def test_each_image_is_torchvisions_crop_and_flip_with_the_drawn_offsets():
    torch.manual_seed(0)
    x = torch.randn(16, 3, 32, 32)
    pad = torch.tensor([-1.0, -2.0, -3.0])
    out = crop_flip(x, torch.Generator().manual_seed(7), pad)
    draws = torch.Generator().manual_seed(7)  # the same draws, in crop_flip's order
    rows, cols = torch.randint(0, 9, (16,), generator=draws), torch.randint(0, 9, (16,), generator=draws)
    flips = torch.randint(0, 2, (16,), generator=draws).bool()
    for b in range(16):
        # torchvision: pad each channel with its black value, crop at (row, col), then flip.
        padded = torch.stack([TF.pad(x[b, c : c + 1], [4], fill=float(pad[c]))[0] for c in range(3)])
        expected = TF.crop(padded, int(rows[b]), int(cols[b]), 32, 32)
        if flips[b]:
            expected = TF.hflip(expected)
        assert torch.equal(out[b], expected)
    assert out.shape == x.shape and out.dtype == x.dtype


def test_crop_and_flip_statistics():
    n = 4000
    ones = torch.ones(n, 1, 32, 32)
    out = crop_flip(ones, torch.Generator().manual_seed(0), torch.zeros(1))
    # Offsets d = row − 4 uniform on −4..4: E|d| = 20/9 padded rows (and columns) per image.
    kept_side = 32 - 20 / 9
    assert out.mean().item() == pytest.approx((kept_side / 32) ** 2, abs=0.01)
    # Without padding only the flip acts: half the images are mirrored.
    ramp = torch.arange(32.0).expand(n, 1, 32, 32)
    flipped = crop_flip(ramp, torch.Generator().manual_seed(1), torch.zeros(1), padding=0)[:, 0, 0, 0] == 31
    assert flipped.float().mean().item() == pytest.approx(0.5, abs=0.03)
    # Every offset 0..8 occurs, each about 1/9 of the time (first row of ones = 1 only when row ≥ 4).
    top_is_padding = out[:, 0, 0, 16] == 0
    assert top_is_padding.float().mean().item() == pytest.approx(4 / 9, abs=0.03)


def test_augmented_local_training_is_reproducible_and_differs_from_plain_training():
    config = training_config({"lr": 0.1, "local-epochs": 1, "batch-size": 8, "momentum": 0.9, "weight-decay": 0.0,
                              "grad-clip": 0.0, "augment": "crop-flip", "augment-pad": [-0.5]})
    augment = batch_augmentation({"augment": "crop-flip", "augment-pad": [-0.5]})
    assert batch_augmentation({"augment": "none"}) is None
    x, y = torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(0)), torch.arange(32) % 10

    def trained(augmentation, seed):
        torch.manual_seed(0)
        model = build_model("mlp", (1, 8, 8), 10)
        train_local(model, x, y, config, torch.Generator().manual_seed(seed), augment=augmentation)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    assert torch.equal(trained(augment, 3), trained(augment, 3))
    assert not torch.equal(trained(augment, 3), trained(augment, 4))
    assert not torch.equal(trained(augment, 3), trained(None, 3))
