"""Strategies by name: validated run config → strategy instance and client schedule.

Methods never read the run config themselves: their declarations' ``build`` and this
module turn it into constructor arguments, so every strategy is usable from a user's own
ServerApp.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from flwr.serverapp.strategy import Strategy

from strategies.cohort import cohort_size
from strategies.methods.registry import AVERAGINGS_BY_NAME, method
from strategies.privacy import ServerSideDP, privacy_accounting
from strategies.round_interface import RoundStrategy
from strategies.schedules import ClientSchedule


def build_base_strategy(config: Mapping[str, Any]) -> RoundStrategy:
    """The base method named by ``config['strategy']`` (config already validated), as its
    declaration builds it (the registry gave the objective-only methods theirs)."""
    build = cast(Callable[[Mapping[str, Any]], RoundStrategy], method(config["strategy"]).build)
    return build(config)


def build_strategy(config: Mapping[str, Any]) -> RoundStrategy:
    """The base method, wrapped by the averaging component when ``averaging`` is set, and
    by server-side differential privacy when ``dp-clipping-norm`` > 0: around the base
    (``dp-order = inside``) or around the averaging (``outside``)."""
    # Every declared method's strategy is a Flower Strategy as well as a RoundStrategy.
    strategy = build_base_strategy(config)
    private = config["dp-clipping-norm"] > 0
    if private and config["dp-order"] == "inside":
        strategy = private_strategy(strategy, config)
    if config["averaging"] != "none":
        strategy = AVERAGINGS_BY_NAME[config["averaging"]].build(cast(Strategy, strategy), config)
    if private and config["dp-order"] == "outside":
        strategy = private_strategy(strategy, config)
    return strategy


def private_strategy(strategy: RoundStrategy, config: Mapping[str, Any]) -> ServerSideDP:
    """``strategy`` inside Flower's server-side fixed-clipping DP (strategies/privacy.py)."""
    cohort = cohort_size(config)
    return ServerSideDP(cast(Strategy, strategy), config["dp-noise-multiplier"], config["dp-clipping-norm"], cohort,
                        config["seed"], privacy_accounting(config, cohort))


def build_client_schedule(config: Mapping[str, Any]) -> ClientSchedule:
    """Client lr and epochs per round: the base schedule, as the averaging rule's declaration
    changes it (IMA's exploration, SWA's cyclic lr)."""
    schedule = ClientSchedule(
        lr=config["lr"],
        decay=config["lr-decay"],
        local_epochs=config["local-epochs"],
        # The FedSWA comparison's cosine over the rounds (every method of it), else lr-decay.
        cosine_rounds=config["num-rounds"] if config["lr-schedule"] == "cosine" else 0,
    )
    if config["averaging"] == "none" or (rule := AVERAGINGS_BY_NAME[config["averaging"]]).client_schedule is None:
        return schedule
    return rule.client_schedule(config, schedule)
