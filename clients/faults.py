"""Injected client faults, to check that a deployment survives misbehaving clients.

The run-config key ``fault-injection`` lists faults as ``KIND:PARTITION`` (every round)
or ``KIND:PARTITION@ROUND``, comma-separated, e.g. ``"raise:0@2, nan:3, hang:1@4"``:

- ``raise``: the ClientApp raises after training;
- ``nan`` / ``inf``: the returned model holds a NaN / an infinity;
- ``shape``: one returned array has one element fewer than the sent one;
- ``hang``: the ClientApp sleeps for twice the round timeout before replying;
- ``oom``: the ClientApp raises torch's CUDA out-of-memory error (on any device), as a
  client of a cohort too large for its GPU does: the run must stop, saying what to lower.

The server must exclude each such reply, count it, and go on (strategies/reply_screening.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

FAULT_KINDS = ("raise", "nan", "inf", "shape", "hang", "oom")
FAULT_FORMAT = "comma-separated KIND:PARTITION or KIND:PARTITION@ROUND with KIND one of " + ", ".join(FAULT_KINDS)


class InjectedFault(RuntimeError):
    """Raised by a ClientApp told to fail (fault-injection = 'raise:…')."""


@dataclass(frozen=True)
class Fault:
    kind: str
    partition_id: int
    server_round: int | None  # None: every round

    def applies(self, partition_id: int, server_round: int) -> bool:
        return self.partition_id == partition_id and self.server_round in (None, server_round)


def parse_faults(spec: str) -> list[Fault]:
    """Parse a fault-injection spec; raises ValueError naming the bad entry."""
    faults = []
    for entry in filter(None, (part.strip() for part in spec.split(","))):
        kind, _, target = entry.partition(":")
        partition, at, server_round = target.partition("@")
        if kind not in FAULT_KINDS or not partition.isdigit() or (at and not server_round.isdigit()):
            raise ValueError(f"fault entry {entry!r} is not {FAULT_FORMAT}")
        faults.append(Fault(kind, int(partition), int(server_round) if server_round else None))
    return faults


def inject_faults(
    spec: str, partition_id: int, server_round: int, state: dict[str, torch.Tensor], round_timeout: float
) -> dict[str, torch.Tensor]:
    """The state dict to reply with after applying the faults meant for this client and round."""
    import torch  # here: the launcher validates fault specs (parse_faults) without torch

    for fault in parse_faults(spec):
        if not fault.applies(partition_id, server_round):
            continue
        if fault.kind == "raise":
            raise InjectedFault(f"injected fault: partition {partition_id} raises in round {server_round}")
        if fault.kind == "oom":
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 20.00 MiB (injected fault: partition {partition_id}, "
                f"round {server_round})")
        if fault.kind == "hang":
            time.sleep(2 * round_timeout)
            continue
        key = next(k for k, v in state.items() if v.is_floating_point())
        tensor = state[key].detach().clone()
        if fault.kind in ("nan", "inf"):
            tensor.view(-1)[0] = float(fault.kind)
        elif fault.kind == "shape":
            tensor = tensor.flatten()[:-1]
        state = {**state, key: tensor}
    return state
