"""GroupNorm ResNets with width-slimmable stages (METHODS.md §4 and §2.1).

- Residual networks: He et al., "Deep Residual Learning for Image Recognition", CVPR 2016
  (CIFAR variants of its §4.2: 3×3 stem, three stages of widths 16/32/64).
- GroupNorm with 2 groups replaces BatchNorm: Wu & He, "Group Normalization", ECCV 2018;
  GroupNorm keeps no running statistics, so federated averaging stays well defined.
- ResNet-20-GN as used by WIMA (Caldarola, Caputo, Ciccone), with He et al.'s
  parameter-free "option A" shortcuts.
- ResNet-56 with Bottleneck blocks [6, 6, 6] (planes 16/32/64, 256 output features) as in
  FedAlign (Mendieta et al., CVPR 2022) and the FedML code it builds on; ``resnet56-bn`` is
  the authors' own BatchNorm network (slimmable BN for the slim pass, no zero-initialised
  residual branches: their ``zero_init_residual=False``), and MOON's variant of it adds their
  two-layer projection head FC(256,256)–ReLU–FC(256,256) before the classifier.
- ResNet-18-GN with the CIFAR stem (3×3 conv, no max-pool) and an FC(512,128) head (IMA).
- ResNet-18-BN, FedSWA's network (the authors' ``models/resnet_bn.py``): the same CIFAR
  ResNet-18 with BatchNorm and no extra head, the 512 pooled features straight to the
  classes; residual branches not zero-initialised (torch's default, as theirs). Their
  stem normalisation is a GroupNorm(2, 64) in that file; Basin's uses BatchNorm like the
  rest of the network (the FedSWA paper's ``--normalization`` default).

Every convolution is a :class:`SlimConv2d`, so any stage (FedAlign slims the last one) or the
whole network (GradAug) can run at a reduced width with :func:`slimmable_width`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from clients.models.slimmable import SlimBatchNorm2d, SlimConv2d, SlimGroupNorm, SlimLinear, StagedNet

Norm = Callable[[int], nn.Module]


def _conv_gn(
    in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, norm: Norm = SlimGroupNorm
) -> list[nn.Module]:
    # bias=False: the norm that follows has its own shift, as in the papers' ResNets.
    conv = SlimConv2d(in_channels, out_channels, kernel_size, stride, padding=kernel_size // 2, bias=False)
    return [conv, norm(out_channels)]


def _zero_pad_shortcut(x: torch.Tensor, stride: int, channels: int, front: int) -> torch.Tensor:
    """He et al.'s option A: subsample by ``stride`` and zero-pad the channels to ``channels``
    with ``front`` zero channels first (at full width 16 → 32 pads 8 + 8 as in the original).

    ``channels`` is taken from the residual branch and ``front`` is the full-width padding, so
    a sliced block keeps its first channels exactly as in the full block: output channel k
    carries input channel k − front at every width (what weight sharing assumes).
    """
    x = x[:, :, ::stride, ::stride]
    front = min(front, channels)
    x = x[:, : channels - front]
    return F.pad(x, (0, 0, 0, 0, front, channels - front - x.shape[1]))


class _ResidualBlock(nn.Module):
    """relu(shortcut(x) + stochastic_depth(branch(x))); subclasses build ``branch``."""

    expansion = 1  # output channels / planes

    def __init__(self, in_channels: int, out_channels: int, stride: int, zero_pad_shortcut: bool, norm: Norm):
        super().__init__()
        # Probability of dropping the residual branch in training (Stochastic Depth,
        # Huang et al., ECCV 2016); set per block by the method that uses it.
        self.drop_rate: float = 0.0
        # Or the branch's factor, drawn by the method beforehand (Stochastic Depth's objective):
        # Bernoulli(1 − rate)/(1 − rate), shape (1, 1, 1, 1), used in place of drop_rate's own draw.
        self.branch_scale: torch.Tensor | None = None
        self.stride = stride
        reshapes = stride != 1 or in_channels != out_channels
        # Shortcut when the block changes the shape: option A (parameter-free zero padding)
        # or a 1×1 conv + GN projection; None otherwise (identity).
        self.zero_pad = reshapes and zero_pad_shortcut
        self.zero_pad_front = (out_channels - in_channels) // 2
        self.shortcut: nn.Module | None = None
        if reshapes and not zero_pad_shortcut:
            self.shortcut = nn.Sequential(*_conv_gn(in_channels, out_channels, 1, stride, norm))

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.branch(x)
        if self.branch_scale is not None and self.training:
            out = out * self.branch_scale
        elif self.drop_rate > 0.0:
            from torchvision.ops import stochastic_depth  # torchvision: a second of import, only where used

            out = stochastic_depth(out, self.drop_rate, mode="batch", training=self.training)
        if self.shortcut is not None:
            identity = self.shortcut(x)
        elif self.zero_pad:
            identity = _zero_pad_shortcut(x, self.stride, out.shape[1], self.zero_pad_front)
        else:
            identity = x
        return F.relu(out + identity)


class BasicBlock(_ResidualBlock):
    """3×3 conv–GN–ReLU–3×3 conv–GN plus shortcut (He et al. 2016, Fig. 2 left)."""

    def __init__(
        self, in_channels: int, planes: int, stride: int = 1, zero_pad_shortcut: bool = False, norm: Norm = SlimGroupNorm
    ):
        super().__init__(in_channels, planes, stride, zero_pad_shortcut, norm)
        self.conv1, self.gn1 = _conv_gn(in_channels, planes, 3, stride, norm)
        self.conv2, self.gn2 = _conv_gn(planes, planes, 3, 1, norm)

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.gn1(self.conv1(x)))
        return self.gn2(self.conv2(out))

    @property
    def last_norm(self) -> nn.Module:
        return self.gn2


class Bottleneck(_ResidualBlock):
    """1×1 reduce – 3×3 (carries the stride, as in torchvision/FedML) – 1×1 expand ×4,
    each followed by GN (He et al. 2016, Fig. 5 right)."""

    expansion = 4

    def __init__(
        self, in_channels: int, planes: int, stride: int = 1, zero_pad_shortcut: bool = False, norm: Norm = SlimGroupNorm
    ):
        super().__init__(in_channels, planes * self.expansion, stride, zero_pad_shortcut, norm)
        self.conv1, self.gn1 = _conv_gn(in_channels, planes, 1, 1, norm)
        self.conv2, self.gn2 = _conv_gn(planes, planes, 3, stride, norm)
        self.conv3, self.gn3 = _conv_gn(planes, planes * self.expansion, 1, 1, norm)

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.gn1(self.conv1(x)))
        out = F.relu(self.gn2(self.conv2(out)))
        return self.gn3(self.conv3(out))

    @property
    def last_norm(self) -> nn.Module:
        return self.gn3


def _stages(
    block: type[_ResidualBlock],
    in_channels: int,
    planes: list[int],
    depths: list[int],
    zero_pad: bool = False,
    norm: Norm = SlimGroupNorm,
) -> list[nn.Module]:
    """One nn.Sequential per stage; the first block of every stage but the first halves
    the spatial size."""
    stages = []
    for index, (width, depth) in enumerate(zip(planes, depths)):
        blocks = []
        for position in range(depth):
            stride = 2 if index > 0 and position == 0 else 1
            blocks.append(block(in_channels, width, stride, zero_pad, norm))
            in_channels = width * block.expansion
        stages.append(nn.Sequential(*blocks))
    return stages


def _stem(in_channels: int, channels: int, norm: Norm = SlimGroupNorm) -> nn.Sequential:
    return nn.Sequential(*_conv_gn(in_channels, channels, 3, 1, norm), nn.ReLU())


def projection_head(features: int) -> nn.Sequential:
    """MOON's two-layer projection head in FedAlign's ResNet-56: FC–ReLU–FC, features wide."""
    return nn.Sequential(SlimLinear(features, features), nn.ReLU(), SlimLinear(features, features))


def _init(model: StagedNet, zero_init_residual: bool = True) -> StagedNet:
    # He (fan-out) initialisation of the convolutions, as torchvision's and FedML's ResNets;
    # GroupNorm starts as the identity (weight 1, bias 0) by default, except the last norm of
    # each residual branch, which starts at 0 (torchvision's zero_init_residual; Goyal et al.
    # 2017): every block starts as its shortcut. Without BatchNorm's batch statistics, deep
    # GN ResNets (ResNet-56) otherwise diverge at the papers' learning rates.
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    if zero_init_residual:
        for block in model.residual_blocks():
            nn.init.zeros_(block.last_norm.weight)
    return model


def resnet20_gn(num_classes: int, in_channels: int = 3) -> StagedNet:
    """CIFAR ResNet-20 (He et al. 2016 §4.2, n = 3) with GroupNorm and option-A shortcuts."""
    stages = _stages(BasicBlock, 16, [16, 32, 64], [3, 3, 3], zero_pad=True)
    return _init(StagedNet(_stem(in_channels, 16), stages, nn.Identity(), SlimLinear(64, num_classes)))


def resnet56(num_classes: int, in_channels: int = 3, projection: bool = False, norm: Norm = SlimGroupNorm) -> StagedNet:
    """FedAlign's ResNet-56: Bottleneck [6, 6, 6], planes 16/32/64 (256 output features),
    projection shortcuts, GroupNorm; ``projection``: MOON's two-layer projection head.
    With ``norm = SlimBatchNorm2d`` (``resnet56_bn``) the residual branches are not
    zero-initialised, as in the authors' BatchNorm network."""
    stages = _stages(Bottleneck, 16, [16, 32, 64], [6, 6, 6], norm=norm)
    head = projection_head(64 * 4) if projection else nn.Identity()
    model = StagedNet(_stem(in_channels, 16, norm), stages, head, SlimLinear(64 * 4, num_classes))
    return _init(model, zero_init_residual=norm is not SlimBatchNorm2d)


def resnet56_bn(num_classes: int, in_channels: int = 3, projection: bool = False) -> StagedNet:
    """FedAlign's ResNet-56 as the authors ran it: BatchNorm (slimmable for the slim pass)."""
    return resnet56(num_classes, in_channels, projection, norm=SlimBatchNorm2d)


def resnet18_gn(num_classes: int, in_channels: int = 3) -> StagedNet:
    """CIFAR-style ResNet-18 (3×3 stem, no max-pool) with GroupNorm and the FC(512,128) head."""
    stages = _stages(BasicBlock, 64, [64, 128, 256, 512], [2, 2, 2, 2])
    # SlimLinear in the head so a whole-network slim pass can feed it sliced features.
    head = nn.Sequential(SlimLinear(512, 128), nn.ReLU())
    return _init(StagedNet(_stem(in_channels, 64), stages, head, SlimLinear(128, num_classes)))


def resnet18_bn(num_classes: int, in_channels: int = 3) -> StagedNet:
    """FedSWA's CIFAR ResNet-18: BatchNorm, the 512 features straight to the classifier."""
    stages = _stages(BasicBlock, 64, [64, 128, 256, 512], [2, 2, 2, 2], norm=SlimBatchNorm2d)
    model = StagedNet(_stem(in_channels, 64, SlimBatchNorm2d), stages, nn.Identity(), SlimLinear(512, num_classes))
    return _init(model, zero_init_residual=False)
