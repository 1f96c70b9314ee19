"""Random crop with padding and horizontal flip on device-resident image batches.

Every CIFAR/Tiny-ImageNet setup of WIMA, FedAlign and FedSWA trains with torchvision's
``RandomCrop(32, padding=4)`` and ``RandomHorizontalFlip()`` (METHODS.md §5): each image
is zero-padded by 4 pixels on every side, a window of the original size is cut at a
uniformly random offset in [0, 2·4] × [0, 2·4], and the window is mirrored left–right with
probability ½. Here the same is done for a whole batch as one gather on the device (no
PIL, no DataLoader): the offsets and flip bits are drawn on the CPU from the client
round's seeded generator, so a run stays bitwise reproducible on the CPU. They are drawn
for the whole round before its first step (:meth:`CropFlip.draws`, in the order a step
after step would draw them) and each step reads its own like its batch, so the crop and
flip run inside a step replayed as a CUDA graph (clients/client_step.py).

The papers pad *before* normalising, so the padding is a black pixel; Basin's tensors are
already standardised, so the pad value is the standardised black pixel of each channel
(``TensorDataset.black``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

CROP_PADDING = 4


def crop_flip_draws(batch: int, generator: torch.Generator, padding: int = CROP_PADDING) -> tuple[torch.Tensor, ...]:
    """One batch's draws from ``generator``, in this order: the row offsets (B), the column
    offsets (B) and the flip bits (B)."""
    rows = torch.randint(0, 2 * padding + 1, (batch,), generator=generator)
    cols = torch.randint(0, 2 * padding + 1, (batch,), generator=generator)
    flips = torch.randint(0, 2, (batch,), generator=generator).bool()
    return rows, cols, flips


def crop_flip_apply(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, flips: torch.Tensor,
                    pad_value: torch.Tensor, padding: int = CROP_PADDING) -> torch.Tensor:
    """``x`` (B, C, H, W) padded by ``padding`` with ``pad_value`` (one value per channel, or
    one for all; on x's device), cropped at the offsets (rows, cols) and flipped where
    ``flips``: device work only, with static shapes."""
    batch, channels, height, width = x.shape
    # The padded batch: the channel's pad value everywhere, the images in the middle.
    padded = pad_value.to(dtype=x.dtype).view(1, -1, 1, 1).expand(
        batch, channels, height + 2 * padding, width + 2 * padding
    ).clone()
    padded[:, :, padding : padding + height, padding : padding + width] = x
    row_index = rows[:, None] + torch.arange(height, device=x.device)  # (B, H)
    col_steps = torch.arange(width, device=x.device)
    # A flipped crop reads its columns right to left: column w of the output is w' = W − 1 − w.
    col_index = cols[:, None] + torch.where(flips[:, None], width - 1 - col_steps, col_steps)  # (B, W)
    batch_index = torch.arange(batch, device=x.device)[:, None, None, None]
    channel_index = torch.arange(channels, device=x.device)[None, :, None, None]
    return padded[batch_index, channel_index, row_index[:, None, :, None], col_index[:, None, None, :]]


def crop_flip(
    x: torch.Tensor, generator: torch.Generator, pad_value: torch.Tensor, padding: int = CROP_PADDING
) -> torch.Tensor:
    """A randomly cropped (after ``padding`` on each side) and flipped copy of ``x`` (B, C, H, W),
    drawing as :func:`crop_flip_draws` does."""
    draws = [d.to(x.device) for d in crop_flip_draws(len(x), generator, padding)]
    return crop_flip_apply(x, *draws, pad_value.to(x.device), padding)


class CropFlip:
    """A round's crop and flip (run config ``augment = "crop-flip"``): the per-step draws of
    a round, and the transform a step applies to its batch. ``pad_value``: per channel."""

    def __init__(self, pad_value: Sequence[float], padding: int = CROP_PADDING):
        self.pad_value = tuple(float(v) for v in pad_value)
        self.padding = padding
        self._pad_tensors: dict[torch.device, torch.Tensor] = {}

    def signature(self) -> tuple:
        """What a captured step bakes in."""
        return ("crop-flip", self.padding, self.pad_value)

    def draws(self, batch_sizes: Sequence[int], generator: torch.Generator) -> list[tuple[torch.Tensor, ...]]:
        """Each step's (rows, cols, flips), drawn in step order."""
        return [crop_flip_draws(size, generator, self.padding) for size in batch_sizes]

    def __call__(self, x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
        # The pad values live on the device from the first (uncaptured) step on: a captured step reads them there.
        pad = self._pad_tensors.get(x.device)
        if pad is None:
            pad = self._pad_tensors[x.device] = torch.tensor(self.pad_value, dtype=torch.float32, device=x.device)
        return crop_flip_apply(x, rows, cols, flips, pad, self.padding)
