"""Windowed model averaging over rounds, composable with any strategy: IMA, WIMA, SWA.

One component wraps a *base* strategy (FedAvg, FedAvgM, FedAdam, FedProx, …) and keeps
averages of the global models the base produces — never of its own outputs:

- **IMA** (Zhou, Lin, Zhang, Tsang; METHODS.md §1.1, their eq. 4): from round t_s on,
  w_IMA^t = (1/P) Σ_{i=0}^{P−1} w^{t−i}; the window starts filling at round t_s − P + 1
  and the average is **sent to the clients** in place of the base model.
- **WIMA** (Caldarola, Caputo, Ciccone; §1.2, their eq. 4): w_WIMA = (1/W) Σ of the last
  W base models, from round W on; a server-side **shadow** model (evaluated, not sent)
  unless ``feedback=True``. Optionally only the feature extractor or only the classifier
  is averaged (their Table 5); the other parameters are the base model's.
- **Server SWA** (Caldarola et al. 2022; §1.3): from the start round on, at the end of
  each lr cycle of length c: w_SWA ← (n·w_SWA + w)/(n + 1); evaluation-only. The
  authors' code (``swa-variant = official-code``, built in strategies/methods/strategy_builder.py) samples
  instead after rounds S + c, S + 2c, … of its start round S: the first round of each
  cycle in the lr schedule's phase, with the first sample c rounds after the start.

IMA on an adaptive server optimiser (FedAdam, FedYogi, FedAdagrad) takes the window mean
as the target of the optimiser's step by default, as the paper and its authors' code do
(strategies/averaging_wrappers.py's :class:`IMA`). The state round-trips through
checkpoints (:class:`ModelAveraging`). The same rules as classes for a user's own
ServerApp: strategies/averaging_wrappers.py.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from clients.options import ConfigError
from strategies.arrays import to_arrays, to_numpy
from strategies.general_keys import AVERAGING_SUBSETS
from strategies.methods import AveragingSpec, TableRow, averaging_start_round
from strategies.round_interface import (
    RoundStrategy,
    WrappingStrategy,
    load_wrapped_checkpoint_state,
    wrapped_checkpoint_state,
)
from strategies.schedules import ClientSchedule

if TYPE_CHECKING:
    from strategies.fedopt import ServerOptimizer


def window_mean(models: Iterable[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Element-wise mean of models (same keys, shapes and dtypes)."""
    models = list(models)
    return {key: np.asarray(sum(m[key] for m in models) / len(models)).astype(models[0][key].dtype) for key in models[0]}


class ModelAveraging(WrappingStrategy, Strategy):
    """Average the base strategy's global models over a window of rounds.

    The state (window, running average, counters) lives here and round-trips through
    :meth:`state_dict` / :meth:`load_state_dict` for checkpoints. Because the round loop
    sends whatever :meth:`aggregate_train` returned, a base that keeps its own copy of the
    current model must take its pseudo-gradient against the arrays it is given in
    ``configure_train`` (Flower's FedOpt family does; Basin's FedAvgM is fixed to).

    Parameters
    ----------
    base : Strategy
        The strategy whose global models are averaged.
    window : int or None
        P (IMA) or W (WIMA): the last ``window`` sampled models are averaged.
        ``None``: a running average of every sampled model (SWA).
    start_round : int
        First round (1-based) whose output is an average.
    feedback : bool
        Send the average to the clients (IMA) instead of the base model (WIMA, SWA).
    sample_every : int
        Sample the base model when ``(round − sample_phase) mod sample_every == 0``
        (SWA: the end of each lr cycle, round ≡ 0 mod c); 1 samples every round.
    sample_phase : int
        The round that sampling is in step with (0: rounds c, 2c, …).
    subset : str
        'all', 'features' (all but the classifier) or 'classifier': which parameters are
        averaged; the others are taken from the newest base model.
    classifier_prefix : str
        Name prefix of the classifier's arrays.
    optimizer_target : bool
        For a base with a step target (strategies/fedopt.ServerOptimizer): average its FMA
        aggregates and make the mean the target of its step (see the module docstring).
    """

    def __init__(
        self,
        base: Strategy,
        window: int | None,
        start_round: int,
        feedback: bool,
        sample_every: int = 1,
        sample_phase: int = 0,
        subset: str = "all",
        classifier_prefix: str = "classifier.",
        optimizer_target: bool = False,
    ) -> None:
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 or None, got {window}")
        if start_round < 1:
            raise ValueError(f"start_round must be >= 1, got {start_round}")
        if sample_every < 1:
            raise ValueError(f"sample_every must be >= 1, got {sample_every}")
        if subset not in AVERAGING_SUBSETS:
            raise ValueError(f"subset must be one of {AVERAGING_SUBSETS}, got {subset!r}")
        self.base = base
        self.window = window
        self.start_round = start_round
        self.feedback = feedback
        self.sample_every = sample_every
        self.sample_phase = sample_phase
        self.subset = subset
        self.classifier_prefix = classifier_prefix
        self.recent_models: deque[dict[str, np.ndarray]] = deque(maxlen=window)
        self.running_mean: dict[str, np.ndarray] | None = None
        self.num_averaged = 0
        self.base_arrays: ArrayRecord | None = None
        self.averaged_arrays: ArrayRecord | None = None
        self.optimizer_target = optimizer_target
        self.moments_reset = False
        self.round_fma: dict[str, np.ndarray] | None = None
        if optimizer_target:
            if not hasattr(base, "step_target"):
                raise ValueError(f"optimizer_target needs a server optimiser with a step target, got {type(base).__name__}")
            base.step_target = self._window_target

    @property
    def wrapped(self) -> Strategy:
        return self.base

    # -- what the round loop asks -------------------------------------------------------
    def first_sampled_round(self) -> int:
        if self.window is None:
            return self.start_round
        return max(1, self.start_round - self.window + 1)

    def is_sampled(self, server_round: int) -> bool:
        in_step = (server_round - self.sample_phase) % self.sample_every == 0
        return server_round >= self.first_sampled_round() and in_step

    def is_active(self, server_round: int) -> bool:
        """Whether the round's output includes an average."""
        return server_round >= self.start_round and (len(self.recent_models) > 0 or self.num_averaged > 0)

    @property
    def sends_average(self) -> bool:
        return self.feedback and self.averaged_arrays is not None

    def prepare_round(self, server_round: int, arrays: ArrayRecord, grid: Grid) -> None:
        """The base method's exchange before training, if it has one."""
        if isinstance(self.base, RoundStrategy):
            self.base.prepare_round(server_round, arrays, grid)

    def checkpoint_state(self) -> dict:
        """The base strategy's checkpoint state (any Flower strategy's attributes), and the window's."""
        return {**wrapped_checkpoint_state(self.base), "averaging": self.state_dict()}

    def load_checkpoint_state(self, state: dict) -> None:
        load_wrapped_checkpoint_state(self.base, state)
        self.load_state_dict(state["averaging"])

    # -- Strategy hooks -----------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.base.configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self.round_fma = None
        base_arrays, metrics = self.base.aggregate_train(server_round, replies)
        if base_arrays is None:
            return None, metrics
        if self.optimizer_target:
            return self._optimizer_output(server_round, base_arrays), metrics
        self.base_arrays = base_arrays
        if self.is_sampled(server_round):
            self._sample(to_numpy(base_arrays))
        self.averaged_arrays = None
        if self.is_active(server_round):
            self.averaged_arrays = to_arrays(self._average(to_numpy(base_arrays)))
        return (self.averaged_arrays if self.sends_average else base_arrays), metrics

    def configure_evaluate(self, server_round, arrays, config, grid):
        return self.base.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round, replies):
        return self.base.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        self.base.summary()

    # -- IMA as the target of a server optimiser's step --------------------------------
    def _window_target(self, server_round: int, fma: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The base's step target: the round's FMA, or from t_s on the window's mean."""
        self.round_fma = fma
        if self.is_sampled(server_round):
            self._sample({key: value.copy() for key, value in fma.items()})
        if not self.is_active(server_round):
            return fma
        optimizer = cast("ServerOptimizer", self.base)  # optimizer_target checked it has a step target
        if not self.moments_reset and optimizer.resets_moments_at_averaging_start:
            optimizer.reset_moments()
        self.moments_reset = True
        return self._average(fma)

    def _optimizer_output(self, server_round: int, output: ArrayRecord) -> ArrayRecord:
        active = self.round_fma is not None and self.is_active(server_round)
        self.base_arrays = to_arrays(self.round_fma) if active and self.round_fma is not None else output
        self.averaged_arrays = output if active else None
        return output

    # -- arithmetic ---------------------------------------------------------------------
    def _sample(self, model: dict[str, np.ndarray]) -> None:
        if self.window is not None:
            self.recent_models.append(model)
            return
        if self.running_mean is None:
            self.running_mean = {k: v.copy() for k, v in model.items()}
        else:
            n = self.num_averaged
            self.running_mean = {
                k: ((n * self.running_mean[k] + model[k]) / (n + 1)).astype(model[k].dtype) for k in model
            }
        self.num_averaged += 1

    def _averaged_keys(self, keys: Iterable[str]) -> set[str]:
        in_classifier = {k for k in keys if k.startswith(self.classifier_prefix)}
        if self.subset == "classifier":
            return in_classifier
        if self.subset == "features":
            return set(keys) - in_classifier
        return set(keys)

    def _average(self, newest: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        mean = window_mean(self.recent_models) if self.window is not None else self.running_mean
        assert mean is not None, "averaged before any model was sampled"
        averaged = self._averaged_keys(newest)
        return {k: (mean[k] if k in averaged else newest[k]) for k in newest}

    # -- checkpoints --------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The component's state as plain numpy arrays and numbers."""
        return {
            "window": [dict(m) for m in self.recent_models],  # the key earlier checkpoints hold
            "running_mean": self.running_mean,
            "num_averaged": self.num_averaged,
            "base_arrays": None if self.base_arrays is None else to_numpy(self.base_arrays),
            "averaged_arrays": None if self.averaged_arrays is None else to_numpy(self.averaged_arrays),
            "moments_reset": self.moments_reset,
        }

    def load_state_dict(self, state: dict) -> None:
        self.recent_models = deque(state["window"], maxlen=self.window)
        self.running_mean = state["running_mean"]
        self.num_averaged = int(state["num_averaged"])
        self.base_arrays = None if state["base_arrays"] is None else to_arrays(state["base_arrays"])
        self.averaged_arrays = None if state["averaged_arrays"] is None else to_arrays(state["averaged_arrays"])
        self.moments_reset = bool(state.get("moments_reset", False))


def window_fits(config) -> None:
    """IMA's and WIMA's window must fill within the run."""
    if config["window"] > config["num-rounds"]:
        raise ConfigError(
            f"run config key 'window' = {config['window']} exceeds num-rounds = {config['num-rounds']}: the window "
            f"of {config['averaging'].upper()} would never fill; allowed: 1..{config['num-rounds']}"
        )


def build_ima(base: Strategy, config) -> ModelAveraging:
    # The IMA authors' ordering on FedAdam/FedYogi/FedAdagrad (see the module docstring).
    optimizer_target = hasattr(base, "step_target") and config["ima-server-opt"] == "fma-target"
    return ModelAveraging(base, config["window"], averaging_start_round(config), feedback=True,
                          subset=config["avg-subset"], optimizer_target=optimizer_target)


def build_swa(base: Strategy, config) -> ModelAveraging:
    start, cycle = averaging_start_round(config), config["swa-cycle"]
    if config["swa-variant"] == "official-code":
        # fedsam's models/main.py: update after rounds i > s with (i − s) mod c = 0.
        return ModelAveraging(base, None, start + cycle, feedback=False, sample_every=cycle, sample_phase=start,
                              subset=config["avg-subset"])
    return ModelAveraging(base, None, start, feedback=False, sample_every=cycle, subset=config["avg-subset"])


def ima_exploration(config, schedule: ClientSchedule) -> ClientSchedule:
    """IMA's client exploration from t_s on (``ima-exploration``, ×``ima-decay`` per round)."""
    return dataclasses.replace(schedule, exploration=config["ima-exploration"],
                               exploration_start=averaging_start_round(config), exploration_decay=config["ima-decay"])


def swa_cycles(config, schedule: ClientSchedule) -> ClientSchedule:
    """Server SWA's cyclic client lr from its start round, cycles of ``swa-cycle`` rounds."""
    return dataclasses.replace(schedule, swa_start=averaging_start_round(config), swa_cycle=config["swa-cycle"])


AVERAGINGS = (
    # IMA and WIMA run end to end under other methods' smoke runs (fedyogi+ima, fedprox+wima, …).
    AveragingSpec("ima", "IMA", build_ima, check=window_fits, client_schedule=ima_exploration,
                  sends_average=lambda config: True,
                  table_row=TableRow('IMA (Zhou et al.) eq. 4: mean of the last P = `window` base models from t_s'
                                     ' = `avg-start`, sent to the clients; exploration `ima-exploration`',
                                     '`exponential` (×`ima-decay` 0.97 per round after t_s; also constant, '
                                     'cyclic, epoch: one epoch fewer every 20 rounds from t_s + 20, none; the IMA'
                                     " code's forms `cyclic-official-code`: cycles from lr_{t_s} to 5e-5, "
                                     '`epoch-official-code`: lr restarts at t_s, lr₀·decay^(t − t_s))')),
    AveragingSpec("wima", "WIMA",
                  lambda base, config: ModelAveraging(base, config["window"], config["window"],
                                                      feedback=config["avg-feedback"], subset=config["avg-subset"]),
                  check=window_fits, first_average=lambda config: config["window"],
                  sends_average=lambda config: config["avg-feedback"],
                  table_row=TableRow('WIMA (Caldarola et al.) eq. 4: mean of the last W = `window` base models '
                                     'from round W',
                                     'server-side shadow model (`avg-feedback = true`: sent); `avg-subset` ∈ all,'
                                     ' features, classifier'),
    ),
    AveragingSpec("swa", "SWA", build_swa, client_schedule=swa_cycles,
                  smoke_runs={"fedavg+swa": {"averaging": "swa", "avg-start": 2, "swa-cycle": 1}},
                  table_row=TableRow('server SWA (Caldarola et al., ECCV 2022): cyclic client lr, w_SWA ← '
                                     "(n·w_SWA + w)/(n + 1) at each cycle's end from `avg-start`",
                                     '`swa-variant = paper` (`official-code`: samples after rounds S + c, S + 2c,'
                                     " …, as fedsam's main.py)"),
    ),
)
