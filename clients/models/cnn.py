"""The CNNs of the seed papers' experiments (METHODS.md §4): IMA's FMNIST and CIFAR CNNs, its
Digit-Five CNN, and WIMA's FEMNIST CNN (FedJAX's)."""

from __future__ import annotations

import torch
from torch import nn


class TwoConvCnn(nn.Module):
    """Conv(c,k,5) ReLU MaxPool2 → Conv(k,k,5) ReLU MaxPool2 → FC(·,384) ReLU →
    FC(384,128) ReLU → FC(128, classes)."""

    def __init__(self, in_channels: int, channels: int, flat_features: int, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, channels, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(channels, channels, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.head = nn.Sequential(
            nn.Linear(flat_features, 384), nn.ReLU(),
            nn.Linear(384, 128), nn.ReLU(),
        )
        self.classifier = nn.Linear(128, num_classes)

    def represent(self, x: torch.Tensor) -> torch.Tensor:
        """The representation fed to the classifier (output of FC(384,128) ReLU)."""
        return self.head(self.features(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.represent(x))


def fmnist_cnn(num_classes: int = 10) -> TwoConvCnn:
    """FMNIST CNN: Conv(1,32,5) … FC(512,384) … FC(128,10); 28×28 inputs."""
    return TwoConvCnn(1, 32, 32 * 4 * 4, num_classes)


def cifar_cnn(num_classes: int = 10) -> TwoConvCnn:
    """CIFAR CNN: Conv(3,64,5) … FC(1600,384) … FC(128,10); 32×32 inputs."""
    return TwoConvCnn(3, 64, 64 * 5 * 5, num_classes)


class DigitFiveCnn(nn.Module):
    """The Digit-Five CNN of IMA's feature-skew runs (METHODS.md §4; FedBN's digit model
    with GroupNorm(2) for BatchNorm): three Conv 5×5 (padding 2) – GN – ReLU blocks,
    2×2 max-pools after the first two → FC(6272, 2048) ReLU → FC(2048, 128) ReLU →
    FC(128, classes); 3×28×28 inputs (128 × 7 × 7 = 6272)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 5, padding=2), nn.GroupNorm(2, 64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 5, padding=2), nn.GroupNorm(2, 64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 5, padding=2), nn.GroupNorm(2, 128), nn.ReLU(),
            nn.Flatten(),
        )
        self.head = nn.Sequential(nn.Linear(6272, 2048), nn.ReLU(), nn.Linear(2048, 128), nn.ReLU())
        self.classifier = nn.Linear(128, num_classes)

    def represent(self, x: torch.Tensor) -> torch.Tensor:
        """The representation fed to the classifier (output of FC(2048,128) ReLU)."""
        return self.head(self.features(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.represent(x))


class FemnistCnn(nn.Module):
    """FedJAX's EMNIST CNN (``fedjax.models.emnist.create_conv_model``, Reddi et al. 2021),
    WIMA's FEMNIST model: Conv(1,32,3) ReLU → Conv(32,64,3) ReLU → MaxPool2 → Dropout(0.25)
    → FC(9216, 128) ReLU → Dropout(0.5) → FC(128, 62); 1×28×28 inputs."""

    def __init__(self, num_classes: int = 62):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Dropout(0.25), nn.Flatten(),
        )
        self.head = nn.Sequential(nn.Linear(9216, 128), nn.ReLU(), nn.Dropout(0.5))
        self.classifier = nn.Linear(128, num_classes)

    def represent(self, x: torch.Tensor) -> torch.Tensor:
        """The representation fed to the classifier (FC(9216,128) ReLU, after dropout)."""
        return self.head(self.features(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.represent(x))
