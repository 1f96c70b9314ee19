"""Strategies by name: validated run config → strategy instance.

Methods never read the run config themselves; this is the one place that turns it into
constructor arguments, so every strategy is usable from a user's own ServerApp.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.serverapp.strategy import Strategy

from strategies.fedavg import FedAvg


def build_strategy(config: Mapping[str, Any]) -> Strategy:
    """Build the strategy named by ``config['strategy']`` (config already validated)."""
    # Federated evaluation is off: the ServerApp evaluates the global model centrally.
    # fraction_train=1 and no minimum: the strategy addresses exactly the sampled cohort.
    common = dict(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=0, min_available_nodes=0)
    if config["strategy"] == "fedavg":
        return FedAvg(**common)
    raise ValueError(f"unknown strategy {config['strategy']!r}")
