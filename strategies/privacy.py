"""Server-side differential privacy with Basin's averaging: DP-FedAvg's fixed-denominator
mean (McMahan, Ramage, Talwar, Zhang, ICLR 2018, Algorithm 1, flat clipping, estimator f̃_f)
on Flower's ``DifferentialPrivacyServerSideFixedClipping``. With w the model sent, m the
round's sampled clients and Δ_k = w_k − w the update of accepted reply k (partition order),

    w̃ = w + (1/m) Σ_k Δ_k · min(1, C / ‖Δ_k‖₂) + N(0, (σ C / m)² I):

a failed reply is a zero update and every client weighs the same, so one client moves the
mean by at most C/m, the sensitivity the noise is set for. The noise is seeded by (seed,
round). The mean takes the place of the base method's own (InPlaceFedAvg's
``private_mean``), so a server step after it (FedAvgM, FedAdam) is post-processing; a method
declared ``dp_aggregate = "own"`` is refused by the run config, and a strategy that
aggregates without the private mean stops the run (:class:`PrivacyNotApplied`).

``dp-order``: ``inside`` (default), averaging(DP(base)): the noise is in every base model,
the average is post-processing. ``outside``, DP(averaging(base)): the base's mean is
noise-free and the noise goes once on what the rule returns, allowed only where each release
is a convex combination of base models w_j + (1/m) Σ Δ̃ (sensitivity still C/m) and the
final model is a release: a base whose model is the mean, a rule that sends its average,
``avg-subset = all``. :func:`privacy_accounting` says how ε is accounted (results.csv's
``dp-epsilon``). docs/your-own-app.md has the whole account.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, Strategy

from clients.flower_internals import add_aggregate_noise, error_in_place_of
from clients.protocol import MODEL_RECORD
from strategies.cohort import cohort_size
from strategies.round_interface import (
    RoundStrategy,
    WrappingStrategy,
    load_wrapped_checkpoint_state,
    wrapped_checkpoint_state,
)
from strategies.weighted_mean import InPlaceFedAvg, array_view

DP_ORDERS = ("inside", "outside")
# The error code of a reply left out for carrying tensors that DP does not clip (Flower's
# codes are small numbers; this one is Basin's).
UNCLIPPED_RECORD_CODE = 4901
# results.csv's column of the ε spent after each round (NaN where no accountant applies).
EPSILON_COLUMN = "dp-epsilon"


class PrivacyNotApplied(RuntimeError):
    """A strategy aggregated a round without DP's private mean: its declaration is wrong."""


@dataclass(frozen=True)
class PrivacyAccounting:
    """How a run's releases are accounted: Flower's RDP accountant's sampling model and
    neighbouring relation, the noise multiplier of one release against the release's
    sensitivity under that relation, and the sample drawn each round of the population;
    or, with ``reason`` set, why no accountant applies."""

    sampling_method: str = ""
    neighboring_relation: str = ""
    noise_multiplier: float = 0.0
    sample_size: int = 0
    population_size: int = 0
    target_delta: float = 0.0
    reason: str = ""

    def epsilon(self, releases: int) -> float:
        """ε after ``releases`` releases at δ = ``target_delta`` (NaN where no accountant applies);
        computed once per count (:func:`_epsilon`)."""
        if self.reason or releases == 0:
            return math.nan if self.reason else 0.0
        return _epsilon(self, releases)

    def description(self) -> dict[str, Any]:
        """summary.json's account of it."""
        if self.reason:
            return {"accountant": "none", "why-not": self.reason}
        return {"accountant": "Flower's RdpAccountant (dp-accounting)", "sampling": self.sampling_method,
                "neighbouring": self.neighboring_relation, "noise-multiplier-per-release": self.noise_multiplier,
                "sample-size": self.sample_size, "population-size": self.population_size, "delta": self.target_delta}


# Composing one sampled-without-replacement release costs about 0.27 s on 2 cores (its RDP
# curve; the count only multiplies it), and the round loop asks for ε more than once a round.
@functools.lru_cache(maxsize=64)
def _epsilon(accounting: PrivacyAccounting, releases: int) -> float:
    """Flower's RdpAccountant: ε after ``releases`` identical releases of ``accounting``."""
    from flwr.serverapp import (  # dp-accounting is imported on first use: a run without DP needs none
        GaussianPrivacyEvent,
        NeighboringRelation,
        PrivacyConfig,
        RdpAccountant,
        SamplingMethod,
    )

    accountant = RdpAccountant(PrivacyConfig(
        target_delta=accounting.target_delta, population_size=accounting.population_size,
        neighboring_relation=NeighboringRelation(accounting.neighboring_relation),
        sampling_method=SamplingMethod(accounting.sampling_method)))
    accountant.compose(GaussianPrivacyEvent(accounting.noise_multiplier, accounting.sample_size,
                                            accounting.population_size), count=releases)
    return float(accountant.get_epsilon(accounting.target_delta))


def privacy_accounting(config: Mapping[str, Any], cohort: int) -> PrivacyAccounting:
    """How a validated run config's DP releases are accounted.

    ``inside``: each round's release is the mean of the cohort's clipped updates, the cohort
    ``cohort`` clients drawn uniformly without replacement from ``num-clients``: Flower's
    ``without-replacement`` model, whose neighbouring relation is ``replace-one``, under
    which one client moves the sum by up to 2C, so the multiplier is σ/2. ``outside``: a
    release averages base models of several rounds' cohorts, whose union is no uniform
    sample, so no amplification (``add-or-remove-one``: sensitivity C/m, multiplier σ)."""
    if config["dp-noise-multiplier"] == 0:
        return PrivacyAccounting(reason="dp-noise-multiplier = 0: the updates are clipped but no noise is added, "
                                        "so no ε holds")
    if config["dead-nodes"] == "skip":
        return PrivacyAccounting(reason="dead-nodes = skip draws the cohort from the nodes still alive, not uniformly "
                                        "from the population")
    try:
        import dp_accounting  # noqa: F401  (Flower's accountant's backend: the extra 'privacy')
    except ImportError:
        return PrivacyAccounting(reason="dp-accounting is not installed (pip install 'basin[privacy]')")
    common = {"target_delta": config["dp-delta"], "population_size": config["num-clients"], "sample_size": cohort}
    if config["dp-order"] == "outside" and config["averaging"] != "none":
        return PrivacyAccounting("no-amplification", "add-or-remove-one", config["dp-noise-multiplier"], **common)
    return PrivacyAccounting("without-replacement", "replace-one", config["dp-noise-multiplier"] / 2, **common)


def privacy_summary(config: Mapping[str, Any]) -> dict[str, Any]:
    """summary.json's "privacy": what the release is, where the noise goes, how it is accounted."""
    cohort = cohort_size(config)
    outside = config["dp-order"] == "outside" and config["averaging"] != "none"
    return {
        "aggregate": f"DP-FedAvg's fixed-denominator mean: w + (1/m)·Σ clipped updates, m = {cohort} sampled clients, "
                     f"a failed reply a zero update, every client the same weight",
        "clipping-norm": config["dp-clipping-norm"], "noise-multiplier": config["dp-noise-multiplier"],
        "noise-std": config["dp-noise-multiplier"] * config["dp-clipping-norm"] / cohort,
        "noise-added-to": (f"what averaging = {config['averaging']!r} returns" if outside
                           else "the mean, before the method's server step"),
        "not-covered": "the clients' training metrics (train-loss, local-steps) and, with client-evaluation (and "
                       "evaluation = federated), their held-out scores, reported un-noised",
        **privacy_accounting(config, cohort).description(),
    }


def innermost_strategy(strategy: Strategy) -> Strategy:
    """The base method under any wrappers (averaging rules, DP)."""
    while isinstance(strategy, WrappingStrategy):
        strategy = strategy.wrapped
    return strategy


class ServerSideDP(WrappingStrategy, DifferentialPrivacyServerSideFixedClipping):
    """DP-FedAvg's fixed-denominator private mean around ``strategy``, seeded per round.

    Parameters
    ----------
    strategy : Strategy
        The strategy whose aggregate is made private: a base method (``dp-order = inside``)
        or an averaging rule around one (``outside``). Its base method must be a Basin
        strategy that aggregates through InPlaceFedAvg's mean.
    noise_multiplier : float
        σ: the noise's standard deviation is σ · clipping_norm / num_sampled_clients.
    clipping_norm : float
        C: the largest L2 norm an update keeps.
    num_sampled_clients : int
        m: the cohort's size, the mean's fixed denominator.
    seed : int
        With the round, seeds the noise.
    accounting : PrivacyAccounting or None
        How the releases are accounted (None: not accounted).
    """

    def __init__(self, strategy: Strategy, noise_multiplier: float, clipping_norm: float, num_sampled_clients: int,
                 seed: int, accounting: PrivacyAccounting | None = None) -> None:
        DifferentialPrivacyServerSideFixedClipping.__init__(
            self, strategy, noise_multiplier=noise_multiplier, clipping_norm=clipping_norm,
            num_sampled_clients=num_sampled_clients)
        base = innermost_strategy(strategy)
        if not isinstance(base, InPlaceFedAvg):
            raise TypeError(f"server-side DP needs a Basin strategy that aggregates through InPlaceFedAvg's mean, got "
                            f"{type(base).__name__}")
        base.private_mean = self.private_mean
        self.base = base
        # Inside, the noise goes on the mean itself, before any server step of the base.
        self.noise_in_mean = base is strategy
        self.seed = seed
        self.accounting = accounting or PrivacyAccounting(reason="no accountant given")
        self.releases = 0
        self.released: ArrayRecord | None = None  # this round's output, noise added
        self.round_mean: ArrayRecord | None = None  # this round's private mean (noised inside)

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
    def round_clients(self) -> dict[str, float]:  # type: ignore[override]
        return {**cast(RoundStrategy, self.wrapped).round_clients, EPSILON_COLUMN: self.accounting.epsilon(self.releases)}

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
        """The wrapped strategy's final model, the released (noisy) average in place of its own:
        outside, the rule's own average is noise-free."""
        average = self.round_models(sent)[1]
        return sent if average is None else average

    def checkpoint_state(self) -> dict[str, Any]:
        # The noise is seeded per round; the accountant is rebuilt from the number of releases.
        return {**wrapped_checkpoint_state(self.strategy), "privacy-releases": self.releases}

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        load_wrapped_checkpoint_state(self.strategy, state)
        self.releases = int(state.get("privacy-releases", 0))

    # -- the private mean ---------------------------------------------------------------
    def private_mean(self, server_round: int, contents: list[RecordDict]) -> ArrayRecord:
        """w + (1/m) Σ_k Δ_k·min(1, C/‖Δ_k‖₂) over ``contents`` (accepted replies, partition
        order), plus the noise when it goes inside (see the module docstring)."""
        keys = list(self.current_arrays.keys())
        sent = [array_view(self.current_arrays[key]) for key in keys]
        for key, array in zip(keys, sent, strict=True):
            if not np.issubdtype(array.dtype, np.floating):
                raise ValueError(f"server-side DP clips and noises floating-point parameters only, but the model's "
                                 f"'{key}' is {array.dtype} (a buffer); use a model without buffers")
        total = [np.zeros_like(array) for array in sent]
        for content in contents:
            record = cast(ArrayRecord, content[MODEL_RECORD])
            update = [array_view(record[key]) - array for key, array in zip(keys, sent, strict=True)]
            norm = math.sqrt(sum(float(np.sum(np.square(u, dtype=np.float64))) for u in update))
            scale = min(1.0, self.clipping_norm / norm) if norm > 0 else 1.0
            for summed, u in zip(total, update, strict=True):
                summed += u * scale  # a Python float: the update's dtype stays; × 1.0 keeps its bits
        mean = ArrayRecord({key: Array(array + summed / self.num_sampled_clients)
                            for key, array, summed in zip(keys, sent, total, strict=True)})
        self.round_mean = self._noised(server_round, mean) if self.noise_in_mean else mean
        return self.round_mean

    def _noised(self, server_round: int, arrays: ArrayRecord) -> ArrayRecord:
        """``arrays`` plus N(0, (σC/m)²) noise drawn by Flower's wrapper, seeded by (seed, round)."""
        if self.noise_multiplier == 0:
            return arrays
        # Flower draws the noise from NumPy's global generator: seeded for this round only.
        outside = np.random.get_state()
        np.random.seed(np.random.SeedSequence([self.seed, server_round]).generate_state(1))
        try:
            return add_aggregate_noise(self, arrays)
        finally:
            np.random.set_state(outside)

    # -- Strategy hooks ---------------------------------------------------------------
    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The wrapped strategy's aggregate with the private mean in place of its base's
        mean, the noise added inside that mean or to the result (outside). A reply that
        carries any ArrayRecord besides its model is failed, not aggregated: what the noise
        covers is the model update alone (the run config refuses the methods that declare
        such records; this keeps a client that sends one anyway out of the private release),
        and the wrapped strategy's screening records it."""
        replies = [self._screened(reply) for reply in replies]
        self.round_mean = self.released = None
        aggregated, metrics = self.strategy.aggregate_train(server_round, replies)
        if aggregated is None:
            return None, metrics
        if self.round_mean is None:
            raise PrivacyNotApplied(
                f"round {server_round}: {type(self.base).__name__} aggregated without server-side DP's private mean, so "
                f"its model is not private; its declaration's dp_aggregate must be 'own' (refused under DP)")
        self.released = aggregated if self.noise_in_mean else self._noised(server_round, aggregated)
        self.releases += 1
        return self.released, metrics

    def _screened(self, reply: Message) -> Message:
        """``reply``, or an error reply in place of one that carries tensors besides its model."""
        if reply.has_error():
            return reply
        others = sorted(set(reply.content.array_records) - {MODEL_RECORD})
        if others:
            return error_in_place_of(
                reply, UNCLIPPED_RECORD_CODE,
                f"the reply carries {', '.join(map(repr, others))} besides its model; server-side DP clips and noises "
                f"the model update only, so it is left out of the private aggregate")
        return reply
