"""A client's round on the simulated clock: its time, and what a straggler policy lets it do.

The server (strategies/system_clock.py) sends each sampled client its compute speed s_k and
bandwidth b_k (bytes per simulated second), and every client the step cost c (simulated
seconds of one local step at speed 1), the straggler policy and the deadline D. A client
that plans K local steps and received a message of B bytes needs

    T_k = K·c / s_k + 2B / b_k

simulated seconds: its steps, then its message both ways (a reply carries what it received:
the model, and a method's records of the model's shape). By the policy:

- ``wait``: it runs all K steps; the round lasts as long as its slowest client.
- ``deadline``: a client with T_k > D does no work and replies LATE: it is dropped, its
  client state untouched (as a client told to stop would be).
- ``partial``: a client with T_k > D runs τ_k = ⌊(D − 2B/b_k)·s_k / c⌋ of its K steps and
  sends that work (the τ_i FedNova normalises); with τ_k < 1 it is late, as under ``deadline``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clients import protocol

STRAGGLER_POLICIES = ("wait", "deadline", "partial")


@dataclass(frozen=True)
class SimulatedWork:
    """What the client does this round on the clock: ``steps`` of its ``planned`` (0: late)
    and the simulated seconds it takes (for a late client, what all of it would have taken)."""

    steps: int
    planned: int
    seconds: float

    @property
    def late(self) -> bool:
        return self.steps == 0


def message_bytes(content: Any) -> int:
    """The bytes of the arrays a message's content carries (the server's traffic count too)."""
    return sum(len(array.data) for record in content.array_records.values() for array in record.values())


def simulated_work(round_config: Mapping[str, Any], planned_steps: int, received_bytes: int) -> SimulatedWork | None:
    """The client's work on the simulated clock, or None when the run has no clock."""
    if protocol.CLIENT_SPEED not in round_config:
        return None
    speed, bandwidth = float(round_config[protocol.CLIENT_SPEED]), float(round_config[protocol.CLIENT_BANDWIDTH])
    step_seconds = float(round_config[protocol.STEP_SECONDS])
    policy, deadline = str(round_config[protocol.STRAGGLER_POLICY]), float(round_config[protocol.ROUND_DEADLINE])
    transfer = 2 * received_bytes / bandwidth
    full = planned_steps * step_seconds / speed + transfer
    if policy == "wait" or full <= deadline:
        return SimulatedWork(planned_steps, planned_steps, full)
    if policy == "deadline":
        return SimulatedWork(0, planned_steps, full)
    # partial: the steps that fit in the deadline after the transfers (a hair of slack for rounding)
    steps = max(0, min(planned_steps, math.floor((deadline - transfer) * speed / step_seconds + 1e-9)))
    if steps == 0:
        return SimulatedWork(0, planned_steps, full)
    return SimulatedWork(steps, planned_steps, steps * step_seconds / speed + transfer)
