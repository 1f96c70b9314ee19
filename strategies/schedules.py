"""The client learning rate (and local epochs) of each round, owned by the server.

Base schedule, run config ``lr-schedule``: ``exponential`` (IMA setup), lr_t = lr_0 ·
decay^(t−1) for round t = 1, 2, …; or ``cosine`` (``cosine_rounds`` = T = num-rounds), lr_t =
lr_0 · (1 + cos(π(t−1)/T))/2, which the FedSWA authors' ``main_FedSWA.py`` gives every
algorithm of their comparison (lr₀ at round 1, → 0 at the end).

IMA's "mild client exploration" from the start round t_s on (METHODS.md §1.1):
- ``exponential`` (paper and code, default): lr_t = lr_{t_s} · d^(t − t_s), d = 0.97;
- ``constant``: lr_t = 5e-5;
- ``cyclic``: linear decay from 1e-2 to 5e-5 over each block of 20 rounds, repeated;
- ``epoch``: the base lr, and one local epoch fewer every 20 rounds, the first 20 rounds
  after t_s (at least one);
- ``none``: the base schedule.

The IMA authors' code runs two of the ablations (Table III) differently; these are the
``official-code`` forms:
- ``cyclic-official-code``: the same 20-round linear cycles, between lr_{t_s} (the base lr
  at t_s) and 5e-5 instead of from 1e-2;
- ``epoch-official-code``: the epochs as ``epoch``, and the lr restarts at t_s from lr_0:
  lr_t = lr_0 · decay^(t − t_s).

Server SWA (§1.3) from its start round s on, cycle length c, with t = round − 1:
τ = ((t mod c) + 1)/c; lr = (1 − τ)·lr1 + τ·lr2, lr1 = lr_s, lr2 = lr1·1e-2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

EXPLORATIONS = ("exponential", "constant", "cyclic", "epoch", "none", "cyclic-official-code", "epoch-official-code")
LR_SCHEDULES = ("exponential", "cosine")
CONSTANT_LR = 5e-5
CYCLIC_HIGH, CYCLIC_LOW, CYCLE_ROUNDS = 1e-2, 5e-5, 20
EPOCH_DECAY_ROUNDS = 20


@dataclass(frozen=True)
class ClientSchedule:
    """Maps a round to (client lr, local epochs)."""

    lr: float
    decay: float
    local_epochs: int
    exploration: str = "none"
    exploration_start: int = 0
    exploration_decay: float = 0.97
    swa_start: int = 0
    swa_cycle: int = 0
    cosine_rounds: int = 0

    def __post_init__(self) -> None:
        if self.exploration not in EXPLORATIONS:
            raise ValueError(f"exploration must be one of {EXPLORATIONS}, got {self.exploration!r}")

    def base_lr(self, server_round: int) -> float:
        if self.cosine_rounds:
            return self.lr * (1 + math.cos(math.pi * (server_round - 1) / self.cosine_rounds)) / 2
        return self.lr * self.decay ** (server_round - 1)

    def __call__(self, server_round: int) -> tuple[float, int]:
        if self.swa_cycle and server_round >= self.swa_start:
            lr1 = self.base_lr(self.swa_start)
            tau = (((server_round - 1) % self.swa_cycle) + 1) / self.swa_cycle
            return (1 - tau) * lr1 + tau * lr1 * 1e-2, self.local_epochs
        if self.exploration == "none" or not self.exploration_start or server_round < self.exploration_start:
            return self.base_lr(server_round), self.local_epochs
        since = server_round - self.exploration_start
        if self.exploration == "exponential":
            return self.base_lr(self.exploration_start) * self.exploration_decay**since, self.local_epochs
        if self.exploration == "constant":
            return CONSTANT_LR, self.local_epochs
        if self.exploration in ("cyclic", "cyclic-official-code"):
            high = CYCLIC_HIGH if self.exploration == "cyclic" else self.base_lr(self.exploration_start)
            position = since % CYCLE_ROUNDS
            return high - (high - CYCLIC_LOW) * position / (CYCLE_ROUNDS - 1), self.local_epochs
        # epoch decay
        # The IMA code ("ED"): E −= 1 when t − t_s is a positive multiple of 20, so the first
        # epoch goes 20 rounds after t_s.
        epochs = max(1, self.local_epochs - since // EPOCH_DECAY_ROUNDS)
        if self.exploration == "epoch-official-code":
            return self.lr * self.decay**since, epochs
        return self.base_lr(server_round), epochs


def ima_client_schedule(lr: float, avg_start: int, local_epochs: int = 1, lr_decay: float = 1.0,
                        exploration: str = "exponential", ima_decay: float = 0.97) -> ClientSchedule:
    """IMA's client side for a user's own ClientApp: ``schedule(server_round)`` gives the
    round's (lr, local epochs), the base schedule lr · lr_decay^(t − 1) before t_s =
    ``avg_start`` and the exploration from it (the run config's ``lr``, ``lr-decay``,
    ``local-epochs``, ``avg-start``, ``ima-exploration`` and ``ima-decay``: what Basin's own
    ClientApp receives each round). The round is Flower's ``config["server-round"]``."""
    return ClientSchedule(lr=lr, decay=lr_decay, local_epochs=local_epochs, exploration=exploration,
                          exploration_start=avg_start, exploration_decay=ima_decay)


def swa_client_schedule(lr: float, avg_start: int, swa_cycle: int, local_epochs: int = 1,
                        lr_decay: float = 1.0) -> ClientSchedule:
    """Server SWA's cyclic client lr for a user's own ClientApp, from ``avg_start`` in cycles of
    ``swa_cycle`` rounds (the run config's ``avg-start`` and ``swa-cycle``; the module docstring)."""
    return ClientSchedule(lr=lr, decay=lr_decay, local_epochs=local_epochs, swa_start=avg_start, swa_cycle=swa_cycle)
