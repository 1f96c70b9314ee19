"""Model arrays as the server-side methods handle them: NumPy views of a record's bytes,
records built from arrays, extra records sent beside the model, and the mean of
counters. Shared by the strategies (one place, not one copy per method)."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord

from strategies.weighted_mean import array_view


def is_float(array: np.ndarray) -> bool:
    """Whether an array holds trained values (floating point), not a counter such as
    BatchNorm's ``num_batches_tracked``."""
    return np.issubdtype(array.dtype, np.floating)


def counter_mean(client_ws: list[dict[str, np.ndarray]], key: str, dtype, weights: list[float] | None = None) -> np.ndarray:
    """The clients' mean of a non-float array (a counter such as ``num_batches_tracked``),
    weighted by ``weights`` when given, rounded back to its dtype: methods whose update
    rule is for trained values apply it to floats only."""
    weights = weights or [1.0] * len(client_ws)
    mean = sum(w * cw[key].astype(np.float64) for w, cw in zip(weights, client_ws)) / sum(weights)
    return np.rint(mean).astype(dtype)


def to_numpy(arrays: ArrayRecord) -> dict[str, np.ndarray]:
    """The record's arrays as read-only views of its bytes (strategies/weighted_mean.py)."""
    return {key: array_view(array) for key, array in arrays.items()}


def to_arrays(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({key: Array(np.ascontiguousarray(value)) for key, value in arrays.items()})


def with_record(messages, key: str, arrays: dict[str, np.ndarray]) -> list:
    """The messages, each carrying ``arrays`` as an extra ArrayRecord named ``key``
    (a server control variate sent beside the model)."""
    record = to_arrays(arrays)
    messages = list(messages)
    for message in messages:
        message.content[key] = record
    return messages
