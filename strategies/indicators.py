"""IMA's decomposition indicators that the server can compute every round (IMA §5, Figs 3–4).

- **Locality** (IMA Thm 1, Fig 3): Δ(t) = max_k ‖w_k^(t) − w_FMA^(t)‖₂ over the trainable
  parameters θ (buffers excluded), with w_FMA^(t) = Σ_k (n_k / Σ_j n_j)·w_k^(t) the same
  round's federated average of the cohort. The paper plots the maximum (its "maximum
  distance"); :func:`client_distances` also gives every client's distance for the mean.
- **Linear CKA** (Kornblith et al. 2019; IMA Fig 4 right): with X̃ = HX, H = I − 11ᵀ/N,
  CKA(X, Y) = ‖ỸᵀX̃‖_F² / (‖X̃ᵀX̃‖_F·‖ỸᵀỸ‖_F), where X ∈ ℝ^{N×c} are one model's outputs on
  N common inputs (a sequence model's outputs at all positions, concatenated). The
  round's value is the mean over client pairs k ≠ k′. Basin's
  default (the paper leaves it open): linear kernel, the models' logits, the first
  :data:`CKA_SAMPLES` samples of the global test set.

The analysis tools (experiments/analysis/) reuse these functions on saved models, so a
run's per-round columns and an offline analysis agree.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

# Common inputs of the per-round CKA: the first this-many samples of the global test set.
CKA_SAMPLES = 1000


def trainable_names(model: nn.Module) -> list[str]:
    """The names of θ's tensors, in ``model.parameters()`` order (buffers are not in θ)."""
    return [name for name, parameter in model.named_parameters() if parameter.requires_grad]


def flatten(state: Mapping[str, np.ndarray | torch.Tensor], names: Sequence[str]) -> torch.Tensor:
    """θ of a state dict: its ``names`` tensors flattened and concatenated (float64)."""
    return torch.cat([torch.as_tensor(state[n]).detach().reshape(-1).to(torch.float64) for n in names])


def client_distances(client_thetas: torch.Tensor, weights: Sequence[float]) -> torch.Tensor:
    """‖w_k − w_FMA‖₂ for every client k (rows of ``client_thetas``), with w_FMA their
    average weighted by ``weights`` (the clients' sample counts n_k)."""
    p = torch.as_tensor(weights, dtype=client_thetas.dtype)
    fma = (p / p.sum()) @ client_thetas
    return torch.linalg.vector_norm(client_thetas - fma, dim=1)


def locality(client_thetas: torch.Tensor, weights: Sequence[float]) -> float:
    """IMA's locality Δ = max_k ‖w_k − w_FMA‖₂."""
    return float(client_distances(client_thetas, weights).max())


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA of two output matrices (N × c each, the same N inputs), in [0, 1]."""
    x = x.to(torch.float64)
    y = y.to(torch.float64)
    x = x - x.mean(dim=0, keepdim=True)
    y = y - y.mean(dim=0, keepdim=True)
    cross = torch.linalg.matrix_norm(y.T @ x) ** 2
    return float(cross / (torch.linalg.matrix_norm(x.T @ x) * torch.linalg.matrix_norm(y.T @ y)))


def mean_pairwise_cka(outputs: Sequence[torch.Tensor]) -> float:
    """The mean linear CKA over all pairs of models (each entry: one model's outputs)."""
    if len(outputs) < 2:
        return float("nan")
    return float(np.mean([linear_cka(a, b) for a, b in itertools.combinations(outputs, 2)]))


@torch.no_grad()
def round_indicators(
    model: nn.Module, client_states: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float], x_common: torch.Tensor,
) -> dict[str, float]:
    """The per-round columns: ``locality`` (max), ``locality-mean`` and ``client-cka`` of
    the cohort's models (``model`` is only a shell: its weights are overwritten)."""
    if not client_states:
        return {"locality": float("nan"), "locality-mean": float("nan"), "client-cka": float("nan")}
    names = trainable_names(model)
    distances = client_distances(torch.stack([flatten(s, names) for s in client_states]), weights)
    device = next(model.parameters()).device
    model.eval()
    outputs = []
    for state in client_states:
        model.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
        outputs.append(model(x_common.to(device)).flatten(1).cpu())  # sequence outputs: all positions
    return {"locality": float(distances.max()), "locality-mean": float(distances.mean()),
            "client-cka": mean_pairwise_cka(outputs)}
