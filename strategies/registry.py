"""Strategies by name: validated run config → strategy instance and client schedule.

Methods never read the run config themselves; this is the one place that turns it into
constructor arguments, so every strategy is usable from a user's own ServerApp.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from flwr.serverapp.strategy import Strategy

from strategies.methods import AVERAGINGS, method
from strategies.round_interface import RoundStrategy
from strategies.schedules import ClientSchedule


def build_base_strategy(config: Mapping[str, Any]) -> RoundStrategy:
    """The base method named by ``config['strategy']`` (config already validated), as its
    declaration builds it (strategies/methods.py gave the objective-only methods theirs)."""
    build = cast(Callable[[Mapping[str, Any]], RoundStrategy], method(config["strategy"]).build)
    return build(config)


def build_strategy(config: Mapping[str, Any]) -> RoundStrategy:
    """The base method, wrapped by the averaging component when ``averaging`` is set."""
    # Every declared method's strategy is a Flower Strategy as well as a RoundStrategy.
    method_strategy = build_base_strategy(config)
    base = cast(Strategy, method_strategy)
    if config["averaging"] == "none":
        return method_strategy
    return AVERAGINGS[config["averaging"]].build(base, config)


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
    if config["averaging"] == "none" or (rule := AVERAGINGS[config["averaging"]]).client_schedule is None:
        return schedule
    return rule.client_schedule(config, schedule)
