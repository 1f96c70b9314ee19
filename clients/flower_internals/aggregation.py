"""Flower's FedAvg and DP internals that Basin's aggregation and server-side DP call, the
array encoding, and the attributes in which Flower's strategies keep state (checkpoints)."""

from __future__ import annotations

from typing import Any

# Attributes in which Flower's strategies keep server state across rounds (FedOpt's
# current model and moments, FedAvgM's momentum).
STRATEGY_STATE_ATTRIBUTES = ("current_arrays", "m_t", "v_t", "momentum_vector")


def check_and_log_replies(strategy: Any, replies: Any, is_train: bool) -> tuple[list, list]:
    """Flower's ``FedAvg._check_and_log_replies``: (valid replies, error replies)."""
    return strategy._check_and_log_replies(replies, is_train=is_train)


def error_in_place_of(reply: Any, code: int, reason: str) -> Any:
    """An error reply with ``reply``'s metadata (its sender and the message it answers):
    Flower's public constructor makes error replies only from the instruction message."""
    from flwr.app import Error
    from flwr.app.message import make_message

    return make_message(reply.metadata, error=Error(code, reason))


def add_aggregate_noise(strategy: Any, aggregated: Any) -> Any:
    """Flower's ``DifferentialPrivacyFixedClippingBase._add_noise_to_aggregated_arrays``:
    ``aggregated`` plus N(0, (σ C / m)²) noise from NumPy's global generator."""
    return strategy._add_noise_to_aggregated_arrays(aggregated)


def numpy_stype() -> str:
    """The ``Array.stype`` of an array serialised with ``np.save``."""
    from flwr.common.constant import SType

    return SType.NUMPY


def strategy_state(strategy: Any) -> dict[str, Any]:
    """The values of :data:`STRATEGY_STATE_ATTRIBUTES` that ``strategy`` has."""
    return {name: getattr(strategy, name) for name in STRATEGY_STATE_ATTRIBUTES if hasattr(strategy, name)}
