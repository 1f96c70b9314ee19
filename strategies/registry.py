"""Strategies by name: validated run config → strategy instance and client schedule.

Methods never read the run config themselves; this is the one place that turns it into
constructor arguments, so every strategy is usable from a user's own ServerApp.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from flwr.serverapp.strategy import Strategy

from strategies.method import averaging_start_round
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
    """Client lr and epochs per round, including IMA exploration and SWA's cyclic lr."""
    start = averaging_start_round(config)
    return ClientSchedule(
        lr=config["lr"],
        decay=config["lr-decay"],
        local_epochs=config["local-epochs"],
        exploration=config["ima-exploration"] if config["averaging"] == "ima" else "none",
        exploration_start=start if config["averaging"] == "ima" else 0,
        exploration_decay=config["ima-decay"],
        swa_start=start if config["averaging"] == "swa" else 0,
        swa_cycle=config["swa-cycle"] if config["averaging"] == "swa" else 0,
        # The FedSWA comparison's cosine over the rounds (every method of it), else lr-decay.
        cosine_rounds=config["num-rounds"] if config["lr-schedule"] == "cosine" else 0,
    )
