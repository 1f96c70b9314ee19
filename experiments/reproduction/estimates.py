"""What a run costs before it starts: its client steps times a measured step cost, on 2 CPU
cores and, where Basin has measured the model there, on one GPU; the listings
(``experiments.run --list-presets``, ``experiments.sweep --list``, ``experiments.reproduce
--list`` and ``--dry-run``) print it, saying which.

The CPU estimate scales FedAvg's step of the run's model (at the run's batch size, or from
the nearest measured ones: :func:`step_at_batch`) (``experiments/measured/step-costs.csv``:
median seconds of one step, one client at a time, 2 CPU cores, as
``.venv/bin/python -m experiments.reproduction.step_costs`` measures them) by what a whole Flower
run took per step on the same cores (a 300-round Fashion-MNIST cell: 17 min 24 s for 180,000
client steps, two clients at a time, 2026-12-06), against the probe's FMNIST CNN step. A
method's own arithmetic (docs/costs.md: up to 3× FedAvg's step) is not in it. A run of more
than :data:`GPU_ADVISED_CPU_SECONDS` on the CPU is "GPU advised".
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from clients.model_names import resolve_model_name
from strategies.cohort import cohort_size

STEP_COSTS = Path(__file__).resolve().parents[1] / "measured" / "step-costs.csv"
# A whole run on 2 CPU cores: seconds and client steps of a 300-round Fashion-MNIST cell (docs/costs.md).
REFERENCE_RUN = {"seconds": 1044.0, "client-steps": 180_000, "key": ("fmnist-cnn", "fashion-mnist", 50)}
# Client steps per second of a Flower run measured on one GPU (docs/costs.md, "On a GPU"):
# {(model, data set, batch size): (steps/s, on what)}.
GPU_STEPS_PER_SECOND = {("fmnist-cnn", "fashion-mnist", 50): (4127.0, "one H100 (CUDA graphs + MPS, measured 2026-11-25)")}
GPU_ADVISED_CPU_SECONDS = 3600.0  # over an hour on 2 CPU cores
# A run of a model whose step is not measured is "GPU advised" from this many client steps
# (an hour of the FMNIST CNN's: a floor, as every other shipped model's step takes longer).
GPU_ADVISED_STEPS = 200_000
# Training-split sizes of the built-in sets (for the client-step estimate without loading them).
TRAIN_SIZES = {"digits": 1438, "fashion-mnist": 60_000, "cifar10": 50_000, "cifar100": 50_000}


@dataclass(frozen=True)
class Estimate:
    """A run's estimated wall time on 2 CPU cores and on one GPU (None: not known, ``why``)."""

    client_steps: int | None
    cpu_seconds: float | None
    gpu_seconds: float | None
    gpu: str = ""  # what the GPU figure was measured on
    why: str = ""

    @property
    def gpu_advised(self) -> bool:
        """Over an hour on 2 CPU cores, or, for a model whose step is not measured, over
        GPU_ADVISED_STEPS client steps."""
        if self.cpu_seconds is not None:
            return self.cpu_seconds > GPU_ADVISED_CPU_SECONDS
        return self.client_steps is not None and self.client_steps >= GPU_ADVISED_STEPS

    def text(self) -> str:
        if self.cpu_seconds is None:
            return f"time not estimated ({self.why})"
        gpu = f"; ≈ {duration(self.gpu_seconds)} on {self.gpu}" if self.gpu_seconds is not None else "; GPU not measured"
        return f"≈ {duration(self.cpu_seconds)} on 2 CPU cores{gpu} ({self.client_steps:,} client steps)"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def local_steps_per_round(config: Mapping[str, Any]) -> int | None:
    """Local steps one client takes per round, for the mean partition size (None when the
    data set's size is not known without loading it)."""
    size = TRAIN_SIZES.get(str(config["dataset"]))
    if size is None:
        return None
    per_client = size / max(1, int(config["num-clients"]))
    return int(config["local-epochs"]) * max(1, math.ceil(per_client / int(config["batch-size"])))


def client_steps(config: Mapping[str, Any]) -> int | None:
    """Client steps of one run (rounds × cohort × local steps), or None when unknown."""
    steps = local_steps_per_round(config)
    return None if steps is None else int(config["num-rounds"]) * cohort_size(config) * steps


@lru_cache(maxsize=2)
def step_costs(path: Path = STEP_COSTS) -> dict[tuple[str, str, int], float]:
    """{(model, data set, batch size): seconds per step} of the measured table."""
    with open(path, newline="") as f:
        return {(row["model"], row["dataset"], int(row["batch-size"])): float(row["seconds-per-step"])
                for row in csv.DictReader(f)}


def estimate(config: Mapping[str, Any], costs: Mapping[tuple[str, str, int], float] | None = None) -> Estimate:
    """The run's :class:`Estimate` (``config``: a resolved run config)."""
    costs = step_costs() if costs is None else costs
    steps = client_steps(config)
    if steps is None:
        return Estimate(None, None, None, why=f"{config['dataset']}'s size is known once it loads")
    key = (resolve_model_name(str(config["model"]), str(config["dataset"])), str(config["dataset"]),
           int(config["batch-size"]))
    seconds = step_at_batch(costs, *key)
    if seconds is None:
        return Estimate(steps, None, None, why=f"no measured step of {key[0]} on {key[1]}")
    run_per_step = REFERENCE_RUN["seconds"] / REFERENCE_RUN["client-steps"] / costs[REFERENCE_RUN["key"]]
    gpu_rate, gpu = GPU_STEPS_PER_SECOND.get(key, (None, ""))
    return Estimate(steps, steps * seconds * run_per_step, steps / gpu_rate if gpu_rate else None, gpu)


def step_at_batch(costs: Mapping[tuple[str, str, int], float], model: str, dataset: str, batch: int) -> float | None:
    """The measured step of ``model`` on ``dataset`` at ``batch``: the measurement itself, else
    the line through the two measured batches nearest to it (a step's cost is a fixed part plus
    one per example), else one measurement scaled by the batch; None without any."""
    measured = sorted((b, seconds) for (m, d, b), seconds in costs.items() if (m, d) == (model, dataset))
    if not measured:
        return None
    exact = dict(measured)
    if batch in exact:
        return exact[batch]
    if len(measured) == 1:
        return measured[0][1] * batch / measured[0][0]
    (b1, s1), (b2, s2) = sorted(sorted(measured, key=lambda m: abs(m[0] - batch))[:2])
    return max(s1 + (s2 - s1) * (batch - b1) / (b2 - b1), min(s1, s2) * batch / max(b1, b2))
