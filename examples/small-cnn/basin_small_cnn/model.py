"""The small CNN: two 3×3 convolutions (16 and 32 channels, ReLU, the second strided), global
average pooling, and a linear classifier."""

from __future__ import annotations

import torch
from torch import nn


class SmallCnn(nn.Module):
    def __init__(self, num_classes: int, in_channels: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.classifier = nn.Linear(32, num_classes)

    def represent(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.represent(x))


def small_cnn(num_classes: int, input_shape: tuple[int, ...]) -> SmallCnn:
    """Basin's call: (number of classes, input shape (C, H, W))."""
    if len(input_shape) != 3:
        raise ValueError(f"small-cnn takes images (C, H, W); the data set has inputs {input_shape}")
    return SmallCnn(num_classes, input_shape[0])
