"""A data set as Basin holds it: whole train and test splits as tensors
(:class:`TensorDataset`), and the decoded arrays they are made from (partitions/cache.py's
entries). Shared by the local loaders (partitions/datasets.py) and the hub's
(partitions/hub.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass(frozen=True)
class TensorDataset:
    """Train and test splits: images (N, C, H, W) float32, labels (N,) int64; ``black`` is
    the value a black pixel has in each channel (0 for images scaled to [0, 1], −mean/std
    once standardised), what crop augmentation pads with."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    black: tuple[float, ...] = ()
    fingerprint: str = ""  # what its content depends on (partitions/cache.py); "" when unknown
    # Per training sample: "coarse" labels, "domain" ids, "natural-id" codes (when the set has them).
    columns: Mapping[str, np.ndarray] = field(default_factory=dict)
    test_domains: np.ndarray | None = None  # the test split's domain ids
    domain_names: tuple[str, ...] = ()  # name of domain id d at position d
    max_value: int = 255  # the largest pixel value of the decoded images (x = pixel / max_value before standardising)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def is_text(self) -> bool:
        """Token sequences (a next-character task), not images."""
        return not self.x_train.is_floating_point()


def scaled_dataset(name: str, raw: dict[str, np.ndarray], fingerprint: str) -> TensorDataset:
    """Decoded arrays (partitions/cache.py's entry: uint8 images (N, C, H, W) with their
    largest value ``max-value``, int64 labels) as images scaled to [0, 1]."""
    scale = float(raw["max-value"])

    def inputs(split: str) -> torch.Tensor:
        if raw[f"x-{split}"].dtype != np.uint8:  # token ids
            return torch.from_numpy(raw[f"x-{split}"])
        # Torch's conversion (a copy: the decoded bytes may be read-only) and in-place division:
        # the values numpy's astype and / give, bit for bit, in a tenth of the time
        # (Fashion-MNIST: 0.1 s instead of 1.2 s per process).
        return torch.tensor(raw[f"x-{split}"], dtype=torch.float32).div_(scale)

    columns = {name: raw[f"{name}-train"] for name in ("coarse", "domain", "natural-id") if f"{name}-train" in raw}
    return TensorDataset(
        name, inputs("train"), torch.from_numpy(raw["y-train"]), inputs("test"), torch.from_numpy(raw["y-test"]),
        int(raw["num-classes"]), fingerprint=fingerprint, columns=columns,
        test_domains=raw.get("domain-test"), domain_names=tuple(str(n) for n in raw.get("domain-names", ())),
        max_value=int(raw["max-value"]),
    )
