"""The memory layout each convolutional model trains in, per device: torch's default
(contiguous NCHW) or channels-last (NHWC), whichever ran its client steps faster.

On the CPU, oneDNN's convolutions run in NHWC without reordering each layer's input and
output: the FMNIST CNN's SGD step ran 1.37× as many steps/s in channels-last on one thread
of a 2-core machine, and eight of the eleven conv models were faster (`experiments.benchmark
--layouts`; docs/speed.md has every model's ratio at 1 and 2 threads and the date). A model,
its client's training inputs, the captured step's static buffers (which copy the batch's
layout) and the server's central evaluation all take the model's layout.

The layout is part of the arithmetic (a convolution's reduction order differs): the same
config on the same kind of machine gives the same bits, and the run's summary records it
(clients/arithmetic.py). ``BASIN_SPEEDUPS=off`` brings the default layout back for every
model. The models without convolutions (the MLP, the LSTM) keep the default.
"""

from __future__ import annotations

import os

import torch

from clients.flower_internals import SPEED_UPS_SWITCH

CHANNELS_LAST = torch.channels_last

# Each convolutional model Basin ships and the input shape its measurement uses.
CONV_MODEL_INPUTS: dict[str, tuple[int, int, int]] = {
    "fmnist-cnn": (1, 28, 28), "femnist-cnn": (1, 28, 28), "digit5-cnn": (3, 28, 28), "cifar-cnn": (3, 32, 32),
    "resnet20-gn": (3, 32, 32), "resnet56": (3, 32, 32), "resnet56-bn": (3, 32, 32), "resnet18-gn": (3, 32, 32),
    "resnet18-bn": (3, 32, 32), "vgg11-gn": (3, 32, 32), "alexnet-gn": (3, 227, 227),
}

# (model, device type) where channels-last ran at least 5 % more client steps/s at both 1 and
# 2 threads (docs/speed.md: 2026-12-06, 2 cores). Not VGG-11 (0.85×, 0.87×) nor the ResNet-18s
# (1.03–1.05×, within the runs' spread); on CUDA nothing is measured yet: the default layout.
CHANNELS_LAST_ON: frozenset[tuple[str, str]] = frozenset({
    ("fmnist-cnn", "cpu"), ("femnist-cnn", "cpu"), ("digit5-cnn", "cpu"), ("cifar-cnn", "cpu"),
    ("resnet20-gn", "cpu"), ("resnet56", "cpu"), ("resnet56-bn", "cpu"), ("alexnet-gn", "cpu"),
})


def memory_format(model_name: str, device_type: str) -> torch.memory_format:
    """The layout ``model_name`` trains in on a device of ``device_type`` ('cpu', 'cuda')."""
    if os.environ.get(SPEED_UPS_SWITCH, "on") == "off":
        return torch.contiguous_format
    return CHANNELS_LAST if (model_name, device_type) in CHANNELS_LAST_ON else torch.contiguous_format


def in_layout(x: torch.Tensor, layout: torch.memory_format) -> torch.Tensor:
    """``x`` (a batch of images, N × C × H × W) in ``layout``; any other tensor as it is."""
    return x.contiguous(memory_format=layout) if x.dim() == 4 else x


def layout_name(layout: torch.memory_format) -> str:
    return "channels-last" if layout == CHANNELS_LAST else "contiguous"
