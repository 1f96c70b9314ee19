"""FedAlign (Mendieta et al., CVPR 2022, "Local Learning Matters"; METHODS.md §2.1).

Local loss (their eq. 5): L = CE(F(x), y) + μ·L_Lip(K_S, K_F), μ = 0.45, ω_S = 0.25.

- The full network gives f_{L−1} (output of the second-to-last stage) and f_L (last).
- The last stage alone is re-run at width ω_S — the first ⌈ω_S·C⌉ channels of every layer,
  sharing the full weights — on the detached, channel-sliced f_{L−1}: f_L^{ω_S}.
- Transmitting matrix (eqs. 6–7): T = f_{L−1}ᵀ f_L / HW per sample, f_{L−1} first
  average-pooled to f_L's spatial size; its Lipschitz constant is the top singular value
  of T, by 10 power iterations on K = T·Tᵀ from v = 1: σ = sqrt(‖K v‖ / ‖v‖).
- L_Lip = MSE(σ_S, σ_F) over the batch, σ_F from the full-width features **detached**:
  the full network is the teacher (the authors pass ``t_feats[-2].detach()`` and
  ``t_feats[-1].detach()``), so L_Lip reaches the last stage's weights only through the
  slim pass, i.e. only their first ⌈ω_S·C⌉ channels.
- As in the authors' code the term is rescaled so that its value equals μ·CE:
  loss = CE + μ·(CE.item() / L_Lip.item())·L_Lip. The scale factor carries no gradient,
  so ∇loss = ∇CE + μ·(CE/L_Lip)·∇L_Lip: CE's gradient is not multiplied by 1 + μ.
  Gradient-norm clip 10 is FedAlign's own (run config ``fedalign-grad-clip``, sent by the
  server in place of ``grad-clip``): in the authors' code only FedAlign clips, not the
  baselines of its study.

Only one model is held; the extra cost is one pass of the slimmed last stage.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from clients.models.slimmable import StagedNet, sliced_channels, slimmable_width
from clients.training import LocalObjective

POWER_ITERATIONS = 10
TINY = 1e-12


def transmitting_matrix(f_in: torch.Tensor, f_out: torch.Tensor) -> torch.Tensor:
    """T[b] = f_in[b] f_out[b]ᵀ / HW, shape (B, C_in, C_out) (FedAlign eqs. 6–7)."""
    if f_in.shape[2:] != f_out.shape[2:]:
        f_in = F.adaptive_avg_pool2d(f_in, f_out.shape[2:])
    a = f_in.flatten(2)
    b = f_out.flatten(2).transpose(1, 2)
    return torch.bmm(a, b) / a.shape[2]


def top_singular_value(matrix: torch.Tensor, iterations: int = POWER_ITERATIONS) -> torch.Tensor:
    """Per-sample spectral norm of ``matrix`` (B, m, n) by power iteration on K = T·Tᵀ."""
    gram = torch.bmm(matrix, matrix.transpose(1, 2))
    v = torch.ones(gram.shape[0], gram.shape[1], 1, device=gram.device, dtype=gram.dtype)
    for _ in range(iterations):
        m = torch.bmm(gram, v)
        n = torch.linalg.vector_norm(m, dim=1, keepdim=True)
        # A zero feature map (e.g. a slim stage whose branches are still at zero) has T = 0:
        # σ = 0 there rather than 0/0, and sqrt's gradient stays finite.
        v = m / n.clamp_min(TINY)
    ratio = n / torch.linalg.vector_norm(v, dim=1, keepdim=True).clamp_min(TINY)
    return torch.sqrt(ratio.clamp_min(TINY)).flatten()


def scaled_lipschitz_loss(cross_entropy: torch.Tensor, lipschitz: torch.Tensor, mu: float) -> torch.Tensor:
    """μ·(CE.item() / L_Lip.item())·L_Lip, as the authors' code writes it: value μ·CE,
    gradient μ·(CE/L_Lip)·∇L_Lip only (the factor is a constant).

    The factor is formed from detached tensors rather than ``.item()`` (the same numbers,
    without a device-to-host synchronisation per step). Where L_Lip = 0 (σ_S = σ_F, e.g.
    residual branches still at zero) there is nothing to align: the term is 0, not CE/0.
    """
    lip = lipschitz.detach()
    scale = torch.where(lip > 0, cross_entropy.detach() / lip.clamp_min(TINY), 0.0)
    return mu * scale * lipschitz


class FedAlign(LocalObjective):
    """CE plus the Lipschitz-matching term between the full and the ω_S-slim last stage."""

    capturable = True  # fixed widths and power iterations, the scale factor on the device

    def __init__(self, mu: float = 0.45, width: float = 0.25):
        self.mu = mu
        self.width = width

    def signature(self) -> tuple:
        return (self.mu, self.width)

    def backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not isinstance(model, StagedNet):
            raise TypeError(f"FedAlign needs a model with a width-slimmable last stage, got {type(model).__name__}")
        stage_outputs, logits = model.forward_stages(x)
        cross_entropy = F.cross_entropy(logits, y)
        # The full network is the teacher: neither of its features carries L_Lip's gradient.
        f_before, f_last = stage_outputs[-2].detach(), stage_outputs[-1].detach()
        f_before_slim = f_before[:, : sliced_channels(f_before.shape[1], self.width)]
        with slimmable_width(model.stages[-1], self.width):
            f_last_slim = model.stages[-1](f_before_slim)
        sigma_slim = top_singular_value(transmitting_matrix(f_before_slim, f_last_slim))
        sigma_full = top_singular_value(transmitting_matrix(f_before, f_last))
        lipschitz = F.mse_loss(sigma_slim, sigma_full)
        loss = cross_entropy + scaled_lipschitz_loss(cross_entropy, lipschitz, self.mu)
        loss.backward()
        return loss.detach()


def fedalign_objective(settings, model: nn.Module, state, rng, records) -> FedAlign:
    """FedAlign's objective with the round's μ and ω_S (the declaration: strategies/fedalign.py)."""
    return FedAlign(float(settings["fedalign-mu"]), float(settings["fedalign-width"]))
