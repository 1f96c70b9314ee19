"""Per-client test slices (``client-evaluation-split = test-slice``): each client's share of the
*test* split, drawn with the client's own label proportions, so per-client accuracy of a
paper's setup needs no training example held out.

Client k of n_k training examples gets s_k = round(f · n_k) test examples (at least one; f =
``client-evaluation``), apportioned over the classes by its label counts (largest remainders,
ties to the lower class), each class's share drawn from that class's test examples in one
seeded order, client after client, so slices are disjoint while a class's test examples last
and wrap around (reusing examples, in the same order) once they run out. A class the test split
lacks gives no examples.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# The stream of seeded draws that orders each class's test examples: its own, so the slices
# move no other draw of the run.
TEST_SLICE_STREAM = 11


def apportion(size: int, counts: np.ndarray) -> np.ndarray:
    """``size`` split over the classes in proportion to ``counts``: the floors of the exact
    shares, plus one for the largest remainders (ties: the lower class), summing to ``size``."""
    total = int(counts.sum())
    if total == 0 or size == 0:
        return np.zeros(len(counts), dtype=np.int64)
    exact = size * counts.astype(np.float64) / total
    shares = np.floor(exact).astype(np.int64)
    left = size - int(shares.sum())
    order = np.lexsort((np.arange(len(counts)), -(exact - shares)))  # largest remainder first
    shares[order[:left]] += 1
    return shares


def test_slices(client_labels: Sequence[np.ndarray], test_labels: np.ndarray, sizes: Sequence[int], seed: int,
                num_classes: int) -> list[np.ndarray]:
    """Each client's test-split indices (sorted): ``sizes[k]`` examples apportioned by client k's
    ``client_labels[k]`` (see the module docstring)."""
    rng = np.random.default_rng([seed, TEST_SLICE_STREAM])
    pools = [rng.permutation(np.flatnonzero(test_labels == c)) for c in range(num_classes)]
    taken = np.zeros(num_classes, dtype=np.int64)
    slices = []
    for labels, size in zip(client_labels, sizes, strict=True):
        demand = apportion(size, np.bincount(labels, minlength=num_classes)[:num_classes])
        parts = []
        for c in np.flatnonzero(demand):
            if len(pools[c]):
                parts.append(pools[c][(taken[c] + np.arange(demand[c])) % len(pools[c])])
            taken[c] += demand[c]
        slices.append(np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64))
    return slices
