"""What a round's replies say of its clients: their steps, busy time, GPU memory and held-out
accuracy (results.csv's client-* columns), and which replies missed the simulated clock's
deadline (clients/system_speed.py)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from flwr.app import Message

from clients import protocol


def reply_metrics(reply: Message) -> dict[str, Any]:
    """A reply's metrics ({} for an error reply or one without any)."""
    if reply.has_error() or not reply.has_content() or not reply.content.metric_records:
        return {}
    return dict(next(iter(reply.content.metric_records.values())))


def late_replies(replies: Iterable[Message]) -> dict[int, float]:
    """{node: the simulated seconds it would have needed} of the replies that say LATE."""
    return {reply.metadata.src_node_id: float(metrics[protocol.SIMULATED_SECONDS])
            for reply in replies if protocol.LATE in (metrics := reply_metrics(reply))}


def client_usage(replies: Iterable[Message]) -> dict[str, float]:
    """What the cohort's clients did (and, with ``client-evaluation``, how the received model
    did on their held-out splits: :func:`client_accuracy`): ``client-steps``, their local steps in all;
    ``client-seconds``, how long at least one of them was working (the union of their
    [train-start, train-end] intervals), so round time minus this is the time spent
    outside client compute; ``client-gpu-mib``, the largest peak CUDA memory of a client
    process (NaN on CPU)."""
    intervals, peaks, steps, accuracies = [], [], 0, []
    for reply in replies:
        metrics: dict[str, Any] = dict(next(iter(reply.content.metric_records.values())))
        steps += int(metrics.get("local-steps", 0))
        if protocol.HELD_OUT_ACCURACY in metrics:
            accuracies.append(float(metrics[protocol.HELD_OUT_ACCURACY]))
        if protocol.TRAIN_START in metrics and protocol.TRAIN_END in metrics:
            intervals.append((float(metrics[protocol.TRAIN_START]), float(metrics[protocol.TRAIN_END])))
        if protocol.GPU_PEAK_MIB in metrics:
            peaks.append(float(metrics[protocol.GPU_PEAK_MIB]))
    return {"client-steps": steps, "client-seconds": union_length(intervals),
            "client-gpu-mib": max(peaks, default=float("nan")), **client_accuracy(accuracies)}


def client_accuracy(accuracies: Sequence[float]) -> dict[str, float]:
    """Across the cohort's clients, the received model's accuracy on each one's held-out
    split (client-evaluation > 0): the mean, the mean of the worst 10 % of clients (at least
    one) and the standard deviation (over the clients, ddof 0); NaN without any."""
    if not accuracies:
        return {}
    ordered = sorted(accuracies)
    worst = ordered[:max(1, math.ceil(0.1 * len(ordered)))]
    return {"client-accuracy-mean": float(np.mean(ordered)), "client-accuracy-worst-10pct": float(np.mean(worst)),
            "client-accuracy-std": float(np.std(ordered))}


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by a set of [start, end] intervals."""
    total, covered_until = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > covered_until:
            total += end - max(start, covered_until)
            covered_until = end
    return total
