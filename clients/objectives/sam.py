"""FedSAM and FedASAM: sharpness-aware local training (Caldarola, Caputo, Ciccone, ECCV
2022; Qu et al., ICML 2022), with SAM (Foret et al., ICLR 2021, eq. 2) and ASAM (Kwon et
al., ICML 2021, eq. 9) as the local optimizer's gradient.

Per batch: g = ∇L(w); the ascent step ε = ρ·g/‖g‖ (SAM) or ε = ρ·T_w²g/‖T_w g‖ with
T_w = |w| + η on weight tensors and 1 on biases (ASAM, as the authors' code); then the
gradient used for the update is ∇L(w + ε), taken at the perturbed weights, and w is
restored. The norm stays on the device (no host synchronisation), so the step is captured
as a CUDA graph. Defaults (METHODS.md §2.2): FedASAM ρ = 0.7, η = 0.2 for the CNNs, ρ = 0.2,
η = 0.05 for other models; FedSAM ρ = 0.05.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from clients.training import CrossEntropy, LocalObjective


class SharpnessAware(LocalObjective):
    """The gradient of ``inner`` taken at the SAM/ASAM-perturbed weights."""

    capturable = True  # two forward-backward passes with static shapes; ε and its norm on the device

    def __init__(self, rho: float, adaptive: bool = False, eta: float = 0.0, inner: LocalObjective | None = None,
                 norm_guard: float = 1e-12):
        self.rho = rho
        self.norm_guard = norm_guard  # ε = ρ·g/(‖g‖ + norm_guard): 1e-12 here, 1e-7 in ESAM (MoFedSAM's code)
        self.adaptive = adaptive
        self.eta = eta
        self.inner = inner or CrossEntropy()
        self.capturable = self.inner.capturable

    def signature(self) -> tuple:
        return (self.rho, self.adaptive, self.eta, self.norm_guard, type(self.inner), self.inner.signature())

    def adopt(self, previous: LocalObjective) -> None:
        self.inner.adopt(previous.inner)

    def backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = self.inner.backward(model, x, y)
        perturbations = self.ascent_step(model)
        model.zero_grad(set_to_none=True)
        self.inner.backward(model, x, y)
        with torch.no_grad():
            for param, epsilon in perturbations:
                param.sub_(epsilon)
        return loss

    @torch.no_grad()
    def ascent_step(self, model: nn.Module) -> list[tuple[nn.Parameter, torch.Tensor]]:
        """Move w to w + ε in place; return the (parameter, ε) pairs to undo it."""
        named = [(n, p) for n, p in model.named_parameters() if p.grad is not None]
        scales = [
            p.abs() + self.eta if self.adaptive and n.endswith("weight") else torch.ones_like(p) for n, p in named
        ]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(s * p.grad) for s, (_, p) in zip(scales, named)]))
        perturbations = []
        for scale, (_, param) in zip(scales, named):
            epsilon = self.rho * scale**2 * param.grad / (norm + self.norm_guard)
            param.add_(epsilon)
            perturbations.append((param, epsilon))
        return perturbations


def esam_objective(settings: Mapping[str, Any], model: nn.Module, state, rng, records) -> SharpnessAware:
    """MoFedSAM's SAM step, with ESAM's norm guard (strategies/mofedsam.py)."""
    return SharpnessAware(float(settings["sam-rho"]), norm_guard=1e-7)


def fedsam_objective(settings: Mapping[str, Any], model: nn.Module, state, rng, records) -> SharpnessAware:
    """FedSAM's SAM step with the round's ρ (the declaration: strategies/sam.py)."""
    return SharpnessAware(float(settings["sam-rho"]))


def fedasam_objective(settings: Mapping[str, Any], model: nn.Module, state, rng, records) -> SharpnessAware:
    """FedASAM's adaptive SAM step with the round's ρ and η."""
    return SharpnessAware(float(settings["sam-rho"]), adaptive=True, eta=float(settings["asam-eta"]))
