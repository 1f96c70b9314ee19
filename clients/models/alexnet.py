"""AlexNet with GroupNorm: IMA's PACS model (METHODS.md §4).

The AlexNet of FedBN's multi-domain experiments (Li et al., ICLR 2021: Krizhevsky et al.'s
five convolutions with a normalisation after each, and after the two hidden FC layers),
with GroupNorm of 2 groups in place of every BatchNorm, as the seed papers do:
Conv(3,64,11,stride 4,pad 2) → MaxPool(3,2) → Conv(64,192,5,pad 2) → MaxPool(3,2) →
Conv(192,384,3) → Conv(384,256,3) → Conv(256,256,3) → MaxPool(3,2), each conv followed by
GN and ReLU → adaptive average pool 6×6 → FC(9216,4096) GN ReLU → FC(4096,4096) GN ReLU →
FC(4096, classes). Any input of at least 63×63 pixels (PACS: 227×227).
"""

from __future__ import annotations

import torch
from torch import nn


def _conv(in_channels: int, out_channels: int, kernel: int, stride: int = 1, padding: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(in_channels, out_channels, kernel, stride, padding), nn.GroupNorm(2, out_channels), nn.ReLU()]


class AlexNetGn(nn.Module):
    """AlexNet-GN; ``represent`` is the second hidden FC layer's output."""

    def __init__(self, num_classes: int = 7, in_channels: int = 3):
        super().__init__()
        self.features = nn.Sequential(
            *_conv(in_channels, 64, 11, stride=4, padding=2), nn.MaxPool2d(3, 2),
            *_conv(64, 192, 5, padding=2), nn.MaxPool2d(3, 2),
            *_conv(192, 384, 3), *_conv(384, 256, 3), *_conv(256, 256, 3), nn.MaxPool2d(3, 2),
            nn.AdaptiveAvgPool2d(6), nn.Flatten(),
        )
        self.head = nn.Sequential(
            nn.Linear(256 * 6 * 6, 4096), nn.GroupNorm(2, 4096), nn.ReLU(),
            nn.Linear(4096, 4096), nn.GroupNorm(2, 4096), nn.ReLU(),
        )
        self.classifier = nn.Linear(4096, num_classes)

    def represent(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.represent(x))
