"""Intervals over seeds, as a reviewer asks for them: the mean of n seeds' values and its 95 %
Student-t confidence interval, mean ± t_{0.975, n−1} · s / √n (s the sample standard
deviation, ddof 1); for a gain, the same over the paired differences of the seeds both runs
share (each seed's averaged run minus the same seed's base run). One seed has no interval."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

CONFIDENCE = 0.95


@dataclass(frozen=True)
class SeedInterval:
    """The mean of ``seeds`` values and its 95 % interval [low, high] (NaN with one seed)."""

    mean: float
    low: float
    high: float
    seeds: int

    def covers(self, value: float) -> bool:
        """Whether ``value`` lies in the interval (never, without one)."""
        return not math.isnan(self.low) and self.low <= value <= self.high

    def text(self, digits: int = 2) -> str:
        """``83.10 [82.40, 83.80] (n = 3)``, or ``83.10 (n = 1)``."""
        interval = "" if math.isnan(self.low) else f" [{self.low:.{digits}f}, {self.high:.{digits}f}]"
        return f"{self.mean:.{digits}f}{interval} (n = {self.seeds})"


def seed_interval(values: Iterable[float]) -> SeedInterval:
    """The mean and 95 % Student-t interval of ``values`` (one per seed; NaN values dropped)."""
    from scipy.stats import t

    kept = [float(v) for v in values if not math.isnan(float(v))]
    if not kept:
        return SeedInterval(math.nan, math.nan, math.nan, 0)
    mean = sum(kept) / len(kept)
    if len(kept) == 1:
        return SeedInterval(mean, math.nan, math.nan, 1)
    s = math.sqrt(sum((v - mean) ** 2 for v in kept) / (len(kept) - 1))
    half = float(t.ppf(0.5 + CONFIDENCE / 2, len(kept) - 1)) * s / math.sqrt(len(kept))
    return SeedInterval(mean, mean - half, mean + half, len(kept))


def paired_interval(with_values: dict[int, float], without_values: dict[int, float]) -> SeedInterval:
    """The interval of the per-seed differences with − without, over the seeds both hold."""
    shared = sorted(set(with_values) & set(without_values))
    return seed_interval(with_values[seed] - without_values[seed] for seed in shared)
