"""What every Basin server strategy is built with (:data:`COHORT`), and how many clients a round samples."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Every Basin strategy addresses exactly the sampled cohort (fraction 1, no minimum), and
# Flower's evaluate round is off: the ServerApp evaluates (centrally, or with its own evaluate
# messages: strategies/federated_evaluation.py).
COHORT: dict[str, Any] = dict(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=0, min_available_nodes=0)


def cohort_size(config: Mapping[str, Any]) -> int:
    """Clients sampled per round: ``clients-per-round`` where it is set (> 0), else
    participation · K rounded, at least one."""
    if config.get("clients-per-round", 0) > 0:
        return int(config["clients-per-round"])
    return max(1, round(config["participation"] * config["num-clients"]))
