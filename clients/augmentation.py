"""Random crop with padding and horizontal flip on device-resident image batches.

Every CIFAR/Tiny-ImageNet setup of WIMA, FedAlign and FedSWA trains with torchvision's
``RandomCrop(32, padding=4)`` and ``RandomHorizontalFlip()`` (METHODS.md §5): each image
is zero-padded by 4 pixels on every side, a window of the original size is cut at a
uniformly random offset in [0, 2·4] × [0, 2·4], and the window is mirrored left–right with
probability ½. Here the same is done for a whole batch as one gather on the device (no
PIL, no DataLoader): the offsets and flip bits are drawn on the CPU from the client
round's seeded generator, so a run stays bitwise reproducible on the CPU.

The papers pad *before* normalising, so the padding is a black pixel; Basin's tensors are
already standardised, so the pad value is the standardised black pixel of each channel
(``TensorDataset.black``).
"""

from __future__ import annotations

import torch

CROP_PADDING = 4


def crop_flip(
    x: torch.Tensor, generator: torch.Generator, pad_value: torch.Tensor, padding: int = CROP_PADDING
) -> torch.Tensor:
    """A randomly cropped (after ``padding`` on each side) and flipped copy of ``x`` (B, C, H, W).

    ``pad_value`` is one value per channel (C,), or one for all. Draws, in this order, from ``generator``:
    the row offsets (B), the column offsets (B) and the flip bits (B).
    """
    batch, channels, height, width = x.shape
    rows = torch.randint(0, 2 * padding + 1, (batch,), generator=generator)
    cols = torch.randint(0, 2 * padding + 1, (batch,), generator=generator)
    flips = torch.randint(0, 2, (batch,), generator=generator).bool()
    rows, cols, flips = rows.to(x.device), cols.to(x.device), flips.to(x.device)
    # The padded batch: the channel's pad value everywhere, the images in the middle.
    padded = pad_value.to(device=x.device, dtype=x.dtype).view(1, -1, 1, 1).expand(
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
