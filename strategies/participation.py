"""Who can take part in a round: Basin's participation models (run-config ``participation-model``).

A round's cohort is sampled (strategies/sampling.py) from the clients *available* in that
round. Which ones are is the participation model's:

- ``uniform`` (the default): every client, every round, as Basin always sampled; no draw is
  made, so a run's bits are those of Basin before the models existed.
- ``availability``: client k is available in round t with its own probability p_k, drawn
  once per client from U[``availability-min``, ``availability-max``] (``availability-source =
  random``), or set by its data size (``data-size``): p_k = min + (max − min)·(n_k − n_min) /
  (n_max − n_min), the largest clients the most available (FLGo's "more data first").
  Independent availability with heterogeneous probabilities is the setting of Wang & Ji,
  "A unified analysis of federated learning with arbitrary client participation" (NeurIPS 2022).
- ``cyclic``: the clients are split into ``cyclic-groups`` groups, client k in group k mod G,
  and group g is available in rounds t with ⌊(t − 1)/R⌋ mod G = g (R = ``cyclic-rounds``):
  each group in turn for R rounds (Cho et al., "On the convergence of federated averaging
  with cyclic client participation", ICML 2023: clients online with the time of day).
- ``data-correlated``: p_k = min + (max − min)·s_k, where s_k is the share of client k's
  examples whose label is one of the first ``correlated-classes`` classes (0: the first half):
  who takes part depends on what it holds, the case where FedAvg's sampled mean is biased.

Every draw is a function of (seed, round, client) alone (:func:`counter_uniforms`, a
SplitMix64 hash): the same in 1 or 16 client processes, on a resume, and in a deployment
whose nodes hold the same partitions, and O(K) vectorised per round, so 10⁶ clients cost
milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

PARTICIPATION_MODELS = ("uniform", "availability", "cyclic", "data-correlated")
AVAILABILITY_SOURCES = ("random", "data-size")

# Independent streams of counter_uniforms: availability per round, p_k per client, and
# the simulated clock's draws (strategies/system_clock.py).
AVAILABLE_IN_ROUND, CLIENT_PROBABILITY = 1, 2

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (Steele, Lea & Flood, OOPSLA 2014), wrapping uint64 arithmetic."""
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _MIX_1
        x = (x ^ (x >> np.uint64(27))) * _MIX_2
        return x ^ (x >> np.uint64(31))


def counter_bits(seed: int, stream: int, server_round: int, clients: np.ndarray) -> np.ndarray:
    """53 random bits per client (uint64), a function of (seed, stream, round, client) only."""
    key = _splitmix64(np.array([seed], dtype=np.uint64))
    key = _splitmix64(key ^ np.uint64(stream))
    key = _splitmix64(key ^ np.uint64(server_round))
    return _splitmix64(np.asarray(clients, dtype=np.uint64) ^ key[0]) >> np.uint64(11)  # a scalar key: 2× faster


def counter_uniforms(seed: int, stream: int, server_round: int, clients: np.ndarray) -> np.ndarray:
    """One uniform draw in [0, 1) per client, a function of (seed, stream, round, client) only."""
    return counter_bits(seed, stream, server_round, clients).astype(np.float64) * (1.0 / 2**53)


class ParticipationModel:
    """Which of K clients are available in a round; :meth:`available` is None for all of them."""

    name = "uniform"

    def available(self, server_round: int, num_clients: int) -> np.ndarray | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"model": self.name}


class Availability(ParticipationModel):
    """Client k is available in round t when its draw u(seed, t, k) < p_k."""

    def __init__(self, name: str, probabilities: np.ndarray, seed: int):
        if np.any((probabilities <= 0) | (probabilities > 1)):
            raise ValueError("availability probabilities must lie in (0, 1]")
        self.name, self.probabilities, self.seed = name, np.asarray(probabilities, dtype=np.float64), seed
        # u < p_k as integers: the 53 bits n give u = n·2⁻⁵³, and n·2⁻⁵³ < p ⇔ n < ⌈p·2⁵³⌉ (exact)
        self.thresholds = np.ceil(self.probabilities * 2.0**53).astype(np.uint64)

    def available(self, server_round: int, num_clients: int) -> np.ndarray:
        thresholds = self.thresholds
        if num_clients != len(thresholds):  # a named node that joined: the probabilities cycle
            thresholds = thresholds[np.arange(num_clients) % len(thresholds)]
        return counter_bits(self.seed, AVAILABLE_IN_ROUND, server_round, np.arange(num_clients)) < thresholds

    def describe(self) -> dict[str, Any]:
        p = self.probabilities
        return {"model": self.name, "probability-mean": float(p.mean()), "probability-min": float(p.min()),
                "probability-max": float(p.max())}


class Cyclic(ParticipationModel):
    """Client k (group k mod G) is available in the rounds of its group's turn."""

    name = "cyclic"

    def __init__(self, groups: int, rounds_per_group: int):
        if groups < 2 or rounds_per_group < 1:
            raise ValueError("cyclic participation needs at least 2 groups and 1 round per group")
        self.groups, self.rounds_per_group = groups, rounds_per_group

    def group_of_round(self, server_round: int) -> int:
        return ((server_round - 1) // self.rounds_per_group) % self.groups

    def available(self, server_round: int, num_clients: int) -> np.ndarray:
        return np.arange(num_clients) % self.groups == self.group_of_round(server_round)

    def describe(self) -> dict[str, Any]:
        return {"model": self.name, "groups": self.groups, "rounds-per-group": self.rounds_per_group}


def spread(low: float, high: float, score: np.ndarray) -> np.ndarray:
    """low + (high − low)·score, score in [0, 1]."""
    return low + (high - low) * np.clip(score, 0.0, 1.0)


def build_participation(config: Mapping[str, Any], partition_sizes: np.ndarray | None = None,
                        label_counts: np.ndarray | None = None) -> ParticipationModel:
    """The run's participation model; ``partition_sizes`` (n_k) and ``label_counts`` (K × C)
    only where it needs them (``data-size``, ``data-correlated``)."""
    model, seed = config["participation-model"], config["seed"]
    low, high, clients = config["availability-min"], config["availability-max"], config["num-clients"]
    if model == "uniform":
        return ParticipationModel()
    if model == "cyclic":
        return Cyclic(config["cyclic-groups"], config["cyclic-rounds"])
    if model == "availability" and config["availability-source"] == "random":
        return Availability(model, spread(low, high, counter_uniforms(seed, CLIENT_PROBABILITY, 0, np.arange(clients))),
                            seed)
    if model == "availability":
        if partition_sizes is None:
            raise ValueError("availability-source = 'data-size' needs the clients' partition sizes")
        sizes = np.asarray(partition_sizes, dtype=np.float64)
        width = sizes.max() - sizes.min()
        return Availability(model, spread(low, high, (sizes - sizes.min()) / width if width else np.ones_like(sizes)),
                            seed)
    if label_counts is None:
        raise ValueError("participation-model = 'data-correlated' needs the clients' label counts")
    counts = np.asarray(label_counts, dtype=np.float64)
    favoured = config["correlated-classes"] or -(-counts.shape[1] // 2)
    share = counts[:, :favoured].sum(axis=1) / np.maximum(counts.sum(axis=1), 1.0)
    return Availability(model, spread(low, high, share), seed)
