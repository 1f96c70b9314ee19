"""What Basin's round loop (strategies/server_work.py) and checkpoints
(strategies/checkpoint.py) ask of a strategy, with the defaults a plain method needs.

A method overrides what it does differently:

- :meth:`RoundStrategy.prepare_round`: an exchange before the round's training (MIME's
  full-batch gradients); by default none.
- the models of a round: the model sent is the round loop's; ``base_arrays`` is the
  round's base model where a method reports one besides it, ``averaged_arrays`` its
  average (strategies/averaging.ModelAveraging), ``sends_average`` whether the average is
  what clients receive; :meth:`round_models` and :meth:`final_arrays` read them.
- :meth:`state_dict` / :meth:`load_state_dict`: the state a method carries across rounds
  (FedDyn's h, FedSWA's momentum, …), for checkpoints; by default none beyond the
  attributes Flower's strategies keep it in (clients/flower_internals/) and SCAFFOLD's
  ``control``, which :meth:`checkpoint_state` adds.

Every strategy the registry builds is one (strategies/sampling.CohortSampling and
ModelAveraging derive from it), so the round loop and checkpoints call these methods
without asking what kind of strategy they hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord

if TYPE_CHECKING:
    import numpy as np
    from flwr.serverapp import Grid

    from strategies.participation import ParticipationModel
    from strategies.reply_screening import ClientFailure
    from strategies.system_clock import SystemClock

from clients.flower_internals import STRATEGY_STATE_ATTRIBUTES

# Attributes in which strategies keep server state across rounds: Flower's FedAvgM's and
# FedOpt's, SCAFFOLD's server control, and the round each partition last trained in
# (strategies/sampling.py, with client-state snapshots).
BASE_STATE_ATTRIBUTES = (*STRATEGY_STATE_ATTRIBUTES, "control", "trained_rounds")


def attribute_state(strategy: Any) -> dict[str, Any]:
    """The values of BASE_STATE_ATTRIBUTES that ``strategy`` (any Flower strategy) has."""
    return {name: getattr(strategy, name) for name in BASE_STATE_ATTRIBUTES if hasattr(strategy, name)}


class RoundStrategy:
    """Mixin: the interface of the round loop and checkpoints (see the module docstring)."""

    base_arrays: ArrayRecord | None = None
    averaged_arrays: ArrayRecord | None = None
    # What the method's clients must do besides local SGD on cross-entropy ("" for a
    # server-only method): a stock Flower ClientApp does not, so the method needs Basin's
    # ClientApp (strategies.client_app:app).
    client_half: str = ""

    # What every Basin strategy also is, for the type checker only (at run time these come
    # from Flower's Strategy and strategies/sampling.CohortSampling, or, under an averaging
    # component, from its base): a Flower strategy over a seeded cohort with per-round
    # bookkeeping.
    round_clients: dict[str, float]
    round_failures: list[ClientFailure]
    round_status: str
    if TYPE_CHECKING:
        def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                            grid: Grid) -> Iterable[Message]: ...

        def aggregate_train(self, server_round: int,
                            replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]: ...

        clock: SystemClock | None

        def bind_partitions(self, partition_of_node: dict[int, int], cohort_size: int, seed: int,
                            min_replies: int = 1, skip_unavailable: bool = False,
                            follow_trained_rounds: bool = False, participation: ParticipationModel | None = None,
                            clock: SystemClock | None = None,
                            local_epochs: Callable[[int, list[int]], dict[int, int] | None] | None = None) -> None: ...

        def follow_rejoined_nodes(self, grid: Grid, timeout: float) -> None: ...

        def round_client_models(self, limit: int | None = None) -> dict[int, tuple[dict[str, np.ndarray], float]]: ...

        def round_client_evaluation(self) -> list[dict[str, Any]]: ...

        def round_cohort(self) -> dict[int, int]: ...

    @property
    def sends_average(self) -> bool:
        return False

    def prepare_round(self, server_round: int, arrays: ArrayRecord, grid) -> None:
        """An exchange before the round's training messages (none by default)."""

    def round_models(self, sent: ArrayRecord) -> tuple[ArrayRecord, ArrayRecord | None]:
        """(the round's base model, its average or None), given the model ``sent``."""
        return (sent if self.base_arrays is None else self.base_arrays), self.averaged_arrays

    def final_arrays(self, sent: ArrayRecord) -> ArrayRecord:
        """The run's result after its last round: the average when there is one."""
        return sent if self.averaged_arrays is None else self.averaged_arrays

    def state_dict(self) -> dict:
        """The method's own state across rounds (none by default)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s state (nothing by default)."""

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything a checkpoint keeps of this strategy."""
        return {"base": attribute_state(self), "method": self.state_dict()}

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        for name, value in state["base"].items():
            setattr(self, name, value)
        if "method" in state:
            self.load_state_dict(state["method"])


class WrappingStrategy(RoundStrategy):
    """Mixin of a strategy that wraps another (an averaging component, server-side DP): the
    round loop asks the outermost strategy for the cohort's sampling and the round's
    bookkeeping, which are the wrapped strategy's. Everything else a wrapper offers it
    defines itself."""

    @property
    def wrapped(self) -> Any:
        """The strategy this one wraps."""
        raise NotImplementedError

    # Read-only here: the wrapped strategy writes them (RoundStrategy declares them as
    # the attributes strategies/sampling.CohortSampling sets).
    @property
    def round_clients(self) -> dict[str, float]:  # type: ignore[override]
        return self.wrapped.round_clients

    @property
    def round_failures(self) -> list[ClientFailure]:  # type: ignore[override]
        return self.wrapped.round_failures

    @property
    def round_status(self) -> str:  # type: ignore[override]
        return self.wrapped.round_status

    def bind_partitions(self, partition_of_node: dict[int, int], cohort_size: int, seed: int,
                        min_replies: int = 1, skip_unavailable: bool = False, follow_trained_rounds: bool = False,
                        participation: ParticipationModel | None = None, clock: SystemClock | None = None,
                        local_epochs: Callable[[int, list[int]], dict[int, int] | None] | None = None) -> None:
        self.wrapped.bind_partitions(partition_of_node, cohort_size, seed, min_replies, skip_unavailable,
                                     follow_trained_rounds, participation, clock, local_epochs)

    @property
    def clock(self) -> SystemClock | None:  # type: ignore[override]
        return self.wrapped.clock

    def follow_rejoined_nodes(self, grid: Grid, timeout: float) -> None:
        self.wrapped.follow_rejoined_nodes(grid, timeout)

    def round_client_models(self, limit: int | None = None) -> dict[int, tuple[dict[str, np.ndarray], float]]:
        return self.wrapped.round_client_models(limit)

    def round_client_evaluation(self) -> list[dict[str, Any]]:
        return self.wrapped.round_client_evaluation()

    def round_cohort(self) -> dict[int, int]:
        return self.wrapped.round_cohort()


def wrapped_checkpoint_state(strategy: Any) -> dict[str, Any]:
    """The checkpoint state of a strategy a component wraps: a Basin strategy's own, or any
    Flower strategy's state attributes."""
    return strategy.checkpoint_state() if isinstance(strategy, RoundStrategy) else {"base": attribute_state(strategy)}


def load_wrapped_checkpoint_state(strategy: Any, state: dict[str, Any]) -> None:
    """Restore :func:`wrapped_checkpoint_state`'s state into ``strategy``."""
    if isinstance(strategy, RoundStrategy):
        strategy.load_checkpoint_state(state)
    else:
        for name, value in state["base"].items():
            setattr(strategy, name, value)
