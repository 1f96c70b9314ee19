"""Device speed, bandwidth and straggler policies on a simulated clock (run-config ``system-speeds``).

Each client k gets a compute speed s_k and a bandwidth b_k, once per run:

- ``lognormal``: ln s_k ~ N(0, ``speed-sigma``²) and b_k = ``bandwidth-mbps`` (megabits per
  second, the median) · exp(N(0, ``bandwidth-sigma``²)), the heavy-tailed spread of device
  traces (FedScale's, Lai et al., ICML 2022);
- ``trace``: the CSV file ``speed-trace`` names, with columns ``speed`` (relative to a step
  costing ``step-seconds``) and ``bandwidth-mbps``; client k takes row k mod R, so a short
  trace serves any number of clients.

Each sampled client is sent its s_k and b_k; it works out its simulated time and what the
policy lets it do (clients/system_speed.py); the round's simulated time is the longest of
its clients' — capped at ``round-deadline`` under ``deadline`` and ``partial``, where the
server stops waiting then. With ``local-epochs-range = "A-B"`` each client draws its local
epochs E_i ∈ {A, …, B} per round (FedNova's setting, Wang et al., NeurIPS 2020, §6).

The draws are strategies/participation.counter_uniforms': functions of (seed, client) and
(seed, round, client), the same in any number of processes and on a resume.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from clients import protocol
from strategies.participation import counter_uniforms

SYSTEM_SPEEDS = ("none", "lognormal", "trace")
# counter_uniforms streams of the clock (strategies/participation.py uses 1 and 2).
_SPEED, _SPEED_PAIR, _BANDWIDTH, _BANDWIDTH_PAIR, _EPOCHS = 11, 12, 13, 14, 15
TRACE_COLUMNS = ("speed", "bandwidth-mbps")
BYTES_PER_MEGABIT = 1e6 / 8


def standard_normals(seed: int, stream: int, pair_stream: int, clients: np.ndarray) -> np.ndarray:
    """N(0, 1) per client from two counter draws (Box–Muller)."""
    u1 = counter_uniforms(seed, stream, 0, clients)
    u2 = counter_uniforms(seed, pair_stream, 0, clients)
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)


def parse_epochs_range(text: str) -> tuple[int, int] | None:
    """``"A-B"`` → (A, B); ``""`` → None; ValueError otherwise."""
    if not text:
        return None
    low, sep, high = text.partition("-")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f"{text!r} is not 'A-B'")
    return int(low), int(high)


def read_trace(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(speeds, bandwidths in bytes per second) of a trace file; ValueError naming the row at fault."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"speed-trace {path!r} is not a file")
    with open(file, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"speed-trace {path!r} lacks column(s) {', '.join(missing)} (it has "
                             f"{', '.join(reader.fieldnames or ()) or 'none'}; allowed: a header with {', '.join(TRACE_COLUMNS)})")
        speeds, bandwidths = [], []
        for line, row in enumerate(reader, start=2):
            try:
                speed, mbps = float(row["speed"]), float(row["bandwidth-mbps"])
            except (TypeError, ValueError):
                raise ValueError(f"speed-trace {path!r} line {line}: {row} is not two numbers") from None
            if not (speed > 0 and mbps > 0 and math.isfinite(speed) and math.isfinite(mbps)):
                raise ValueError(f"speed-trace {path!r} line {line}: speed and bandwidth-mbps must be finite and > 0")
            speeds.append(speed)
            bandwidths.append(mbps * BYTES_PER_MEGABIT)
    if not speeds:
        raise ValueError(f"speed-trace {path!r} has no rows")
    return np.array(speeds), np.array(bandwidths)


class SystemClock:
    """Per-client speeds and bandwidths, what each sampled client is sent, and a round's time."""

    def __init__(self, config: Mapping[str, Any]):
        self.seed, clients = config["seed"], np.arange(config["num-clients"])
        if config["system-speeds"] == "trace":
            self.speeds, self.bandwidths = read_trace(config["speed-trace"])
        else:
            self.speeds = np.exp(config["speed-sigma"] * standard_normals(self.seed, _SPEED, _SPEED_PAIR, clients))
            self.bandwidths = config["bandwidth-mbps"] * BYTES_PER_MEGABIT * np.exp(
                config["bandwidth-sigma"] * standard_normals(self.seed, _BANDWIDTH, _BANDWIDTH_PAIR, clients))
        self.policy, self.step_seconds = config["straggler-policy"], config["step-seconds"]
        self.deadline = config["round-deadline"] if self.policy != "wait" else math.inf

    def round_entries(self) -> dict[str, Any]:
        """What every client's round config carries."""
        return {protocol.STEP_SECONDS: self.step_seconds, protocol.STRAGGLER_POLICY: self.policy,
                protocol.ROUND_DEADLINE: self.deadline if math.isfinite(self.deadline) else 0.0}

    def client_entries(self, partition: int) -> dict[str, float]:
        row = partition % len(self.speeds)
        return {protocol.CLIENT_SPEED: float(self.speeds[row]), protocol.CLIENT_BANDWIDTH: float(self.bandwidths[row])}

    def round_seconds(self, client_seconds: list[float]) -> float:
        """The round's simulated time: its slowest client's, the deadline at most (0 without clients)."""
        return min(max(client_seconds, default=0.0), self.deadline)

    def describe(self, config: Mapping[str, Any]) -> dict[str, Any]:
        speeds, mbps = self.speeds, self.bandwidths / BYTES_PER_MEGABIT
        return {"speeds": config["system-speeds"], "straggler-policy": self.policy,
                "round-deadline": self.deadline if math.isfinite(self.deadline) else None,
                "step-seconds": self.step_seconds,
                "speed-p10-p50-p90": [float(v) for v in np.percentile(speeds, [10, 50, 90])],
                "bandwidth-mbps-p10-p50-p90": [float(v) for v in np.percentile(mbps, [10, 50, 90])]}


def local_epochs_of(config: Mapping[str, Any], server_round: int, partitions: list[int]) -> dict[int, int] | None:
    """With ``local-epochs-range``: each partition's local epochs this round, E_i ∈ {A, …, B}."""
    bounds = parse_epochs_range(config["local-epochs-range"])
    if bounds is None:
        return None
    low, high = bounds
    draws = counter_uniforms(config["seed"], _EPOCHS, server_round, np.asarray(partitions, dtype=np.int64))
    return {p: low + min(int(u * (high - low + 1)), high - low) for p, u in zip(partitions, draws)}
