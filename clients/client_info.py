"""What a client knows about itself, handed to its method's client half.

Before a round's first step, every local objective and every client component of the round
receives one :class:`ClientInfo` through its ``see_client`` hook
(:meth:`clients.training.LocalObjective.see_client`,
:meth:`clients.components.ClientComponent.see_client`): the label counts of the split it
trains on, its size, its partition, the data set, the round and the run-config keys its
method declares. The label-skew methods need it: logit calibration by the client's label
counts (FedLC), balanced softmax, losses restricted to the classes a client holds.

It stays on the client. A server rule that needs it asks for it by declaring it in its
``reply_records`` (``label-counts``, clients/protocol.py): then it leaves the client with
every reply, as the declaration says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch


@dataclass(frozen=True)
class ClientInfo:
    """A client's description of itself, read-only.

    Attributes
    ----------
    partition_id : int
        The partition its node holds.
    num_examples : int
        The examples of its training split (after any held-out split, ``client-evaluation``).
    label_counts : tuple[int, ...]
        Per class, its training split's examples of that class (length ``num_classes``; a
        sequence model's: its scored targets per class).
    num_classes : int
        The data set's classes, as trained on.
    dataset : str
        The ``dataset`` key's value.
    server_round : int
        The round it trains in (1-based).
    run_config : Mapping[str, Any]
        The run-config keys its method declares (its ``options``), with the run's values.
    """

    partition_id: int
    num_examples: int
    label_counts: tuple[int, ...]
    num_classes: int
    dataset: str
    server_round: int
    run_config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, y: torch.Tensor, num_classes: int, partition_id: int = 0, dataset: str = "", server_round: int = 1,
           run_config: Mapping[str, Any] | None = None) -> ClientInfo:
        """The description of a client that trains on labels ``y`` (padding, negative, is not a label)."""
        labels = y[y >= 0].flatten().to(torch.int64)
        if len(labels) and int(labels.max()) >= num_classes:
            raise ValueError(f"partition {partition_id} holds label {int(labels.max())}, out of range for num_classes = "
                             f"{num_classes} (labels 0..{num_classes - 1}); its counts would drop it")
        counts = torch.bincount(labels.cpu(), minlength=num_classes)
        return cls(partition_id, len(y), tuple(int(c) for c in counts[:num_classes]), num_classes, dataset,
                   server_round, MappingProxyType(dict(run_config or {})))

    def label_count_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``label_counts`` as a float tensor on ``device``."""
        return torch.tensor(self.label_counts, dtype=torch.float32, device=device)
