"""Server-side differential privacy with Basin's averaging: Flower's
``DifferentialPrivacyServerSideFixedClipping`` in Basin's round loop.

DP-FedAvg's server side (McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private
Recurrent Language Models", ICLR 2018, Algorithm 1 with flat clipping): each reply's update
Δ_k = w_k − w (its model minus the model sent) is clipped to L2 norm at most C,

    Δ_k ← Δ_k · min(1, C / ‖Δ_k‖₂),

the wrapped strategy aggregates the clipped models w + Δ_k, and Gaussian noise
N(0, (σ C / m)² I) is added to what it returns (σ the noise multiplier, m the sampled
clients). The arithmetic is Flower's; Basin draws the noise from a generator seeded by
(seed, round), so a run repeats bit for bit and a resumed run draws what the uninterrupted
one drew, and with σ = 0 and a norm no update reaches, a run gives the bits of the same
run without DP.

Where it sits relative to the averaging rule (run-config key ``dp-order``):

- ``inside`` (the default): averaging(DP(base)). The noise is added to every base model,
  so each round's release is private, and the window's average is post-processing of
  private releases: averaging P noisy models divides the noise's variance by up to P.
- ``outside``: DP(averaging(base)). The noise is added once, to what the averaging rule
  returns: the average for IMA (which clients then receive), the base model for WIMA and
  SWA. The window itself holds noise-free base models, so an average that is not what
  clients receive (WIMA, SWA: their final model) is not private.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, Strategy

from clients.flower_internals import add_aggregate_noise, clip_model_update, error_in_place_of
from clients.protocol import MODEL_RECORD
from strategies.round_interface import (
    RoundStrategy,
    WrappingStrategy,
    load_wrapped_checkpoint_state,
    wrapped_checkpoint_state,
)

DP_ORDERS = ("inside", "outside")
# The error code of a reply left out for carrying tensors that DP does not clip (Flower's
# codes are small numbers; this one is Basin's).
UNCLIPPED_RECORD_CODE = 4901


class ServerSideDP(WrappingStrategy, DifferentialPrivacyServerSideFixedClipping):
    """Flower's server-side fixed-clipping DP around ``strategy``, seeded per round.

    Parameters
    ----------
    strategy : Strategy
        The strategy whose aggregate is made private: a base method (``dp-order = inside``)
        or an averaging rule around one (``outside``).
    noise_multiplier : float
        σ: the noise's standard deviation is σ · clipping_norm / num_sampled_clients.
    clipping_norm : float
        C: the largest L2 norm an update keeps.
    num_sampled_clients : int
        m: the cohort's size.
    seed : int
        With the round, seeds the noise.
    """

    def __init__(self, strategy: Strategy, noise_multiplier: float, clipping_norm: float, num_sampled_clients: int,
                 seed: int) -> None:
        DifferentialPrivacyServerSideFixedClipping.__init__(
            self, strategy, noise_multiplier=noise_multiplier, clipping_norm=clipping_norm,
            num_sampled_clients=num_sampled_clients)
        self.seed = seed
        self.released: ArrayRecord | None = None  # this round's output, noise added

    @property
    def wrapped(self) -> Strategy:
        return self.strategy

    # IMA's fma-target ordering sets the step target of the server optimiser it wraps.
    @property
    def step_target(self) -> Any:
        return cast(Any, self.strategy).step_target  # AttributeError (hasattr False) where the wrapped one has none

    @step_target.setter
    def step_target(self, target: Any) -> None:
        cast(Any, self.strategy).step_target = target

    # … and, once its averages start, resets the optimiser's moments (strategies/fedopt.py).
    @property
    def resets_moments_at_averaging_start(self) -> bool:
        return bool(cast(Any, self.strategy).resets_moments_at_averaging_start)

    def reset_moments(self) -> None:
        cast(Any, self.strategy).reset_moments()

    @property
    def inner(self) -> RoundStrategy | None:
        return self.strategy if isinstance(self.strategy, RoundStrategy) else None

    # -- what the round loop asks ------------------------------------------------------
    @property
    def sends_average(self) -> bool:
        return self.inner.sends_average if self.inner else False

    def prepare_round(self, server_round: int, arrays: ArrayRecord, grid) -> None:
        if self.inner:
            self.inner.prepare_round(server_round, arrays, grid)

    def round_models(self, sent: ArrayRecord) -> tuple[ArrayRecord, ArrayRecord | None]:
        """The wrapped strategy's models, the released (noisy) one in place of the one it returned."""
        if self.inner is None:
            return sent, None
        base, average = self.inner.round_models(sent)
        if self.released is None:
            return base, average
        return (base, self.released) if self.inner.sends_average else (self.released, average)

    def final_arrays(self, sent: ArrayRecord) -> ArrayRecord:
        return self.inner.final_arrays(sent) if self.inner else sent

    def checkpoint_state(self) -> dict[str, Any]:
        # No state of its own: the noise is seeded per round.
        return wrapped_checkpoint_state(self.strategy)

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        load_wrapped_checkpoint_state(self.strategy, state)

    # -- Strategy hooks ---------------------------------------------------------------
    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's server-side clipping and noise, with four differences: only the model
        record is clipped (Flower's wrapper clips every ArrayRecord of a reply as if it were
        the model), and a reply that carries any other ArrayRecord is failed, not aggregated,
        since what the noise covers is the model update alone (the run config refuses the
        methods that declare such records; this keeps a client that sends one anyway out of
        the private release); a failed reply goes on to the wrapped strategy, whose screening
        records it and aggregates the others (Flower's wrapper skips the round); a reply
        within the clipping norm keeps its bits; and the noise is seeded by (seed, round)."""
        sent = self.current_arrays.to_numpy_ndarrays()  # once a round, not once a reply
        replies = [self._clipped(reply, sent) for reply in replies]
        aggregated, metrics = self.strategy.aggregate_train(server_round, replies)
        self.released = None
        if aggregated is not None:
            # Flower draws the noise from NumPy's global generator: seeded for this round only.
            outside = np.random.get_state()
            np.random.seed(np.random.SeedSequence([self.seed, server_round]).generate_state(1))
            try:
                self.released = add_aggregate_noise(self, aggregated)
            finally:
                np.random.set_state(outside)
        return self.released, metrics

    def _clipped(self, reply: Message, sent: list[np.ndarray]) -> Message:
        """``reply`` with its model update from ``sent`` clipped to the norm; an error reply in
        place of one that carries tensors besides its model."""
        if reply.has_error():
            return reply
        others = sorted(set(reply.content.array_records) - {MODEL_RECORD})
        if others:
            return error_in_place_of(
                reply, UNCLIPPED_RECORD_CODE,
                f"the reply carries {', '.join(map(repr, others))} besides its model; server-side DP clips and noises "
                f"the model update only, so it is left out of the private aggregate")
        record = reply.content.array_records.get(MODEL_RECORD)
        if record is not None:
            arrays = record.to_numpy_ndarrays()
            if clip_model_update(arrays, sent, self.clipping_norm):
                reply.content[MODEL_RECORD] = ArrayRecord(dict(zip(record.keys(), map(Array, arrays), strict=True)))
        return reply
