"""Width-slimmable layers that share the full-width weights.

A layer run at width ``w`` < 1 uses the first channels of its full-width weight tensors
(no copy), as in slimmable / universally slimmable networks (Yu et al., ICLR 2019;
Yu & Huang, ICCV 2019) and in the sub-networks of GradAug (Yang et al., NeurIPS 2020)
and FedAlign (Mendieta et al., CVPR 2022), whose code builds on those layers.
Normalisation is GroupNorm with 2 groups (Wu & He, ECCV 2018) instead of BatchNorm,
as every model of METHODS.md §4, except FedAlign's own BatchNorm ResNet-56
(:class:`SlimBatchNorm2d`, the authors' slimmable BN).

Only :class:`SlimConv2d` chooses its output width; :class:`SlimGroupNorm`,
:class:`SlimBatchNorm2d` and :class:`SlimLinear` follow the channel count of their input. :class:`StagedNet` is the
layout of the slimmable networks (the ResNets of ``resnet.py``): stem, stages, head,
classifier.

Requirement: a :class:`SlimGroupNorm` needs a channel count divisible by its 2 groups at
every width. :func:`sliced_channels` therefore rounds ``ceil(width·channels)`` up to an
even number; with the even widths of the models here (16 … 512) the widths FedAlign uses
(0.25) need no rounding (e.g. 0.25 of 16 = 4), while GradAug's random widths in [0.8, 1]
do (0.8 of 16 = 12.8 → 13 → 14).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

GN_GROUPS = 2


def sliced_channels(channels: int, width: float, divisor: int = 0) -> int:
    """Channels kept at ``width``: ceil(width·channels), rounded up to a multiple of the
    GroupNorm groups so a sliced GroupNorm stays valid, and at most ``channels``.

    The tolerance keeps float products such as 0.1·30 = 3.0000000000000004 from rounding up.
    With ``divisor`` > 0: width·channels rounded to the nearest multiple of ``divisor``, not
    going more than 10 % below it (slim's ``make_divisible``, which GradAug's code rounds
    its sub-networks with, divisor 8), at most ``channels``.
    """
    if divisor:
        value = width * channels
        kept = max(divisor, int(value + divisor / 2) // divisor * divisor)
        if kept < 0.9 * value:
            kept += divisor
        return max(1, min(channels, kept))
    kept = math.ceil(width * channels - 1e-9)
    kept = GN_GROUPS * math.ceil(kept / GN_GROUPS)
    return max(1, min(channels, kept))


class SlimConv2d(nn.Conv2d):
    """Conv2d (groups = 1) using ``weight[:out, :in]``: ``in`` = channels of the input,
    ``out`` = ``sliced_channels(out_channels, width)``, or all output channels when
    ``fixed_out`` (a layer whose output size must not change with the width)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int = 0,
        dilation: int = 1,
        bias: bool = True,
        fixed_out: bool = False,
    ):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, bias=bias)
        self.width: float = 1.0
        self.channel_divisor: int = 0  # 0: Basin's rounding; 8: GradAug's (see sliced_channels)
        self.fixed_out = fixed_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.out_channels if self.fixed_out else sliced_channels(self.out_channels, self.width, self.channel_divisor)
        weight = self.weight[:out, : x.shape[1]]
        bias = self.bias[:out] if self.bias is not None else None
        return F.conv2d(x, weight, bias, self.stride, self.padding, self.dilation)


class SlimGroupNorm(nn.GroupNorm):
    """GroupNorm with 2 groups whose affine parameters are sliced to the input's channels."""

    def __init__(self, num_channels: int, num_groups: int = GN_GROUPS, eps: float = 1e-5):
        super().__init__(num_groups, num_channels, eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x.shape[1]
        return F.group_norm(x, self.num_groups, self.weight[:c], self.bias[:c], self.eps)


class SlimBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm whose affine parameters are sliced to the input's channels, with the
    authors' "universally slimmable" BN semantics (FedAlign's ``USBatchNorm2d``): at full
    width it keeps and uses running statistics; at a reduced width it always normalises
    with the batch's own statistics and updates nothing (one set of running statistics,
    the full network's, as in FedAlign's and GradAug's code).

    ``num_batches_tracked`` is not kept (the momentum is fixed at 0.1, so it is never read):
    every array of the state dict is a float that averaging over clients keeps meaningful.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__(num_features, eps, momentum)
        self.register_buffer("num_batches_tracked", None)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args) -> None:
        # BatchNorm's own loader treats a state dict without version metadata (one rebuilt
        # from a Flower ArrayRecord) as pre-1.0 and inserts a num_batches_tracked entry,
        # which this layer does not have: load it as a plain module instead.
        nn.Module._load_from_state_dict(self, state_dict, prefix, local_metadata, *args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x.shape[1]
        if c == self.num_features:
            return F.batch_norm(
                x, self.running_mean, self.running_var, self.weight, self.bias, self.training, self.momentum, self.eps
            )
        return F.batch_norm(x, None, None, self.weight[:c], self.bias[:c], True, 0.0, self.eps)


class SlimLinear(nn.Linear):
    """Linear layer using ``weight[:, :in]`` with ``in`` = features of the input; the output
    is always full width (it is a classifier or the input side of a head)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight[:, : x.shape[-1]], self.bias)


class StagedNet(nn.Module):
    """stem → stages → adaptive average pool 1×1 → flatten → head → classifier.

    Methods that work on stage outputs (FedAlign's last-stage slimming, feature alignment)
    or on the representation fed to the classifier (MOON) use the named parts. The pooling
    is adaptive, so the input size only has to survive the stages' strides (≥ 8×8 here).
    """

    def __init__(self, stem: nn.Module, stages: list[nn.Module], head: nn.Module, classifier: SlimLinear):
        super().__init__()
        self.stem = stem
        self.stages = nn.ModuleList(stages)
        self.head = head
        self.classifier = classifier

    def _pooled(self, f: torch.Tensor) -> torch.Tensor:
        return torch.flatten(F.adaptive_avg_pool2d(f, 1), 1)

    def represent(self, x: torch.Tensor) -> torch.Tensor:
        """The representation fed to the classifier (pooled features after the head)."""
        out = self.stem(x)
        for stage in self.stages:
            out = stage(out)
        return self.head(self._pooled(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.represent(x))

    def forward_stages(self, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The output of every stage (not the stem's) and the logits."""
        outputs = []
        out = self.stem(x)
        for stage in self.stages:
            out = stage(out)
            outputs.append(out)
        return outputs, self.logits_from_last_stage(out)

    def logits_from_last_stage(self, f: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.head(self._pooled(f)))

    def residual_blocks(self) -> list[nn.Module]:
        """All residual blocks, from the input side to the output side."""
        return [block for stage in self.stages for block in stage]


@contextmanager
def slimmable_width(module: nn.Module, width: float, divisor: int = 0) -> Iterator[nn.Module]:
    """Run every :class:`SlimConv2d` of ``module`` (itself included) at ``width`` inside the
    block, its channels rounded as :func:`sliced_channels` with ``divisor``; the previous
    settings come back on exit, even after an exception."""
    if not 0.0 < width <= 1.0:
        raise ValueError(f"width must be in (0, 1], got {width}")
    layers = [m for m in module.modules() if isinstance(m, SlimConv2d)]
    previous = [(layer.width, layer.channel_divisor) for layer in layers]
    for layer in layers:
        layer.width, layer.channel_divisor = width, divisor
    try:
        yield module
    finally:
        for layer, (old_width, old_divisor) in zip(layers, previous):
            layer.width, layer.channel_divisor = old_width, old_divisor
