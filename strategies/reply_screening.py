"""Screening a round's replies: which clients failed, and why.

A client counts as failed for the round, and its reply is left out of aggregation, when

- its ClientApp raised (Flower then delivers an error reply),
- its reply lacks the model record or a metrics record,
- the model it returned does not have the sent model's array names and shapes,
- any floating-point array it returned (model or control variate) holds NaN or ±inf, or
- no reply came within the round timeout.

Each failure is attributed to the node the round's message was sent to, and to that
node's partition, so a researcher can tell a flaky machine from a diverging client.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, Message

from strategies.weighted_mean import array_view

# The layout of a model: {array name: shape}. Dtypes may legitimately differ (Flower's
# FedOpt strategies send float64 models; clients reply in their model's float32).
Layout = dict[str, tuple[int, ...]]

TIMEOUT_REASON = "no reply within round-timeout"
# Flower's reason (lower case) for a node that stopped sending heartbeats.
NODE_UNAVAILABLE = "node unavailable"
# Reasons (lower case) that say a client's process, or the process owning it, died (Ray's
# actor errors in a simulation): the machinery failed, not the client's work.
PROCESS_DEATH_MARKERS = (
    "actor is dead", "owner has died", "actor died", "actordiederror", "rayactorerror", "worker died",
    "worker unexpectedly exit",
)


# Reasons (lower case) that say a client's process ran out of GPU memory (torch's
# OutOfMemoryError): the cohort's processes do not fit beside each other on the GPU.
OUT_OF_MEMORY_MARKERS = ("cuda out of memory", "outofmemoryerror")


def out_of_gpu_memory(failures: Iterable[ClientFailure]) -> ClientFailure | None:
    """The first client failure that is a CUDA out-of-memory error, or None."""
    return next((f for f in failures if any(marker in f.reason.lower() for marker in OUT_OF_MEMORY_MARKERS)), None)


def infrastructure_loss(failures: Iterable[ClientFailure], aggregated: bool) -> str | None:
    """Why a round must not count, or None. A client whose process died (see
    PROCESS_DEATH_MARKERS) leaves a cohort that is not the config's, even when the others
    replied: the first such reason. A round that aggregated nothing because every client's
    node is unavailable (Flower's "Node Unavailable"): that reason. Else None (a dead
    SuperNode among live ones is an ordinary client failure)."""
    failures = list(failures)
    deaths = [f for f in failures if any(marker in f.reason.lower() for marker in PROCESS_DEATH_MARKERS)]
    if deaths:
        return deaths[0].reason
    if not aggregated and failures and all(NODE_UNAVAILABLE in f.reason.lower() for f in failures):
        return failures[0].reason
    return None


@dataclass(frozen=True)
class ClientFailure:
    """One client's failure in one round."""

    node_id: int
    partition_id: int
    reason: str

    def __str__(self) -> str:
        return f"partition {self.partition_id} (node {self.node_id}): {self.reason}"


def layout_of(arrays: Mapping[str, Any]) -> Layout:
    """The names and shapes of an ArrayRecord's arrays (read from their headers)."""
    return {key: tuple(array.shape) for key, array in arrays.items()}


def reply_problem(reply: Message, model_key: str, expected: Layout | None) -> str | None:
    """Why ``reply`` cannot be aggregated, or None when it can."""
    if reply.has_error():
        return f"client error: {_first_line(reply.error.reason or '')}"
    content = reply.content
    if model_key not in content.array_records:
        return f"reply has no '{model_key}' ArrayRecord"
    if not content.metric_records:
        return "reply has no MetricRecord"
    model = content.array_records[model_key]
    if expected is not None:
        received = layout_of(model)
        if set(received) != set(expected):
            missing, extra = sorted(set(expected) - set(received)), sorted(set(received) - set(expected))
            return f"model arrays differ from the sent model's: missing {missing}, unexpected {extra}"
        for key, shape in expected.items():
            if received[key] != shape:
                return f"array '{key}' has shape {received[key]}, sent {shape}"
    for record_name, record in content.array_records.items():
        for key, array in record.items():
            if not all_finite(array):
                return f"non-finite values (NaN or inf) in {record_name}['{key}']"
    return None


def all_finite(array: Array) -> bool:
    """Whether a Flower ``Array``'s values are all finite (non-float arrays always are),
    read in place (strategies/weighted_mean.py)."""
    values = array_view(array)
    return not np.issubdtype(values.dtype, np.floating) or bool(np.isfinite(values).all())


def screen_replies(
    replies: Iterable[Message],
    sent_to: Mapping[int, int],
    partition_of_node: Mapping[int, int],
    model_key: str,
    expected: Layout | None,
    destinations: Mapping[str, int] | None = None,
) -> tuple[list[Message], list[ClientFailure]]:
    """Split a round's replies into those fit to aggregate and the clients that failed.

    ``sent_to`` maps each node the round addressed to its partition; an addressed node
    without a reply failed by timeout. A reply from a node the round did not address (the
    SuperLink's own error for a dead node) stands for the node its message was sent to
    (``destinations``: {message id: node}, strategies/exchange.Replies), so a dead node is
    one failure, under its partition, with Flower's reason. Both lists come sorted by
    partition id, so aggregation sums in the same order in every run and engine.
    """
    def partition_of(node_id: int) -> int:  # the round's nodes first; no O(K) merge per round
        return sent_to[node_id] if node_id in sent_to else partition_of_node.get(node_id, -1)

    destinations = destinations or {}
    accepted, failures, replied = [], [], set()
    for reply in replies:
        node_id = reply.metadata.src_node_id
        if node_id not in sent_to:
            node_id = destinations.get(reply.metadata.reply_to_message_id, node_id)
        replied.add(node_id)
        problem = reply_problem(reply, model_key, expected)
        if problem is None:
            accepted.append(reply)
        else:
            failures.append(ClientFailure(node_id, partition_of(node_id), problem))
    failures.extend(ClientFailure(node, part, TIMEOUT_REASON) for node, part in sent_to.items() if node not in replied)
    accepted.sort(key=lambda r: partition_of(r.metadata.src_node_id))
    failures.sort(key=lambda f: f.partition_id)
    return accepted, failures


def _first_line(text: str, limit: int = 300) -> str:
    """The telling part of a client's error text: the last line of a traceback, without the
    wrapper the simulation adds ("Exception ClientAppException occurred. Message: …'>")."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[-1] if lines else "(no reason given)"
    if "occurred. Message: " in line:
        line = line.rsplit("occurred. Message: ", 1)[1].removesuffix("'>")
    return line if len(line) <= limit else line[: limit - 1] + "…"


class ClientProcessesDied(RuntimeError):
    """A client of a round failed because its process died (or every client's node is
    unavailable): the run stops, and that round is neither recorded nor checkpointed."""


class ClientStateLost(RuntimeError):
    """A stateful node that trained before came back without its client state (its
    client-state-dir is gone): the run stops, its checkpoint kept."""


class ClientOutOfGpuMemory(RuntimeError):
    """A client process ran out of GPU memory: the run stops, its checkpoint kept."""


class NothingTrained(RuntimeError):
    """Every round of a run was skipped: its result is the untrained model's."""


def nothing_trained_reason(rows: Iterable[Mapping[str, object]], config: Mapping[str, object]) -> str | None:
    """Why a run trained nothing, with a hint (None when some round aggregated): every
    round skipped, the first round's failures quoted, e.g. "all client replies were
    non-finite from round 1 (…): lr = inf?"."""
    rows = list(rows)
    if not rows or any(row.get("round-status") == "aggregated" for row in rows):
        return None
    failures = str(rows[0].get("failures") or "no client replied")
    status = str(rows[0].get("round-status", ""))
    if "available clients" in status:  # a participation model left too few to sample
        what, hint = "too few clients were available", (
            f"make more clients available (a higher availability-min, fewer cyclic-groups) or lower min-replies (= "
            f"{config['min-replies']})")
        failures = status.removeprefix("skipped: ")
    elif "non-finite" in failures:
        what, hint = "all client replies were non-finite", f"local training diverged: is lr = {config['lr']} too large?"
    elif TIMEOUT_REASON in failures:
        what, hint = "clients did not reply in time", f"raise round-timeout (= {config['round-timeout']} s)"
    elif "client error" in failures:
        what, hint = "clients failed", "their errors are in flwr.log"
    else:
        what, hint = "too few client replies were accepted", f"lower min-replies (= {config['min-replies']})"
    shown = failures if len(failures) <= 300 else failures[:299] + "…"
    return (f"no round trained the model: {what} in every round from round {rows[0]['round']} on "
            f"(round {rows[0]['round']}: {shown}); {hint}")
