"""MIME and MimeLite, client side (Karimireddy, Jaggi, Kale, Mohri, Reddi, Stich, Suresh,
"Breaking the centralized barrier for cross-device federated learning", NeurIPS 2021,
arXiv 2008.03606; strategies/mime.py has the server and the sources).

- :func:`full_gradient`: G_i = ∇f_i(θ), the mean gradient over all of the client's examples
  at the received model, without updating it (the round's extra exchange). BatchNorm layers
  run in eval mode, so their running statistics stay untouched (the codes leave the mode
  open); Basin's GroupNorm models are unaffected.
- :class:`MimeObjective`: Mime's corrected gradient g̃ = ∇ℓ(y; ζ) − ∇ℓ(θ; ζ) + c, both
  gradients on the same batch, θ a frozen copy of the received model in the same mode.
- :func:`momentum_term`: the server's frozen optimizer state in every step: g ← β·m + g̃
  (PyTorch's heavy ball, the default) or g ← (1 − β)·g̃ + β·m (``dampened``); m is never
  changed on the client.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from flwr.app import RecordDict
from torch import nn
from torch.nn import functional as F

from clients import protocol
from clients.client_step import GradientTerm
from clients.components import ClientComponent, FixedTerms
from clients.training import LocalObjective


def full_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024) -> dict[str, torch.Tensor]:
    """The mean cross-entropy gradient over (x, y) at the model's weights, by parameter name."""
    was_training = model.training
    model.eval()
    model.zero_grad(set_to_none=True)
    for start in range(0, len(y), batch_size):
        # Σ over batches of (batch loss sum)/n: the mean over every example.
        loss = F.cross_entropy(model(x[start : start + batch_size]), y[start : start + batch_size], reduction="sum")
        (loss / len(y)).backward()
    gradients = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return gradients


class MimeObjective(LocalObjective):
    """g̃ = ∇ℓ(y; ζ) − ∇ℓ(θ; ζ) + c, θ the model received this round."""

    capturable = True  # a second forward-backward at θ, static shapes
    round_state = ("anchor", "correction")  # θ and c: loaded into the first round's copies

    def __init__(self, model: nn.Module, full_gradient_mean: Mapping[str, torch.Tensor]):
        self.anchor = copy.deepcopy(model)  # θ, frozen: its gradients are taken, never applied
        device = next(model.parameters()).device
        self.correction = [full_gradient_mean[name].to(device) for name, _ in model.named_parameters()]

    def backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        self.anchor.train(model.training)
        self.anchor.zero_grad(set_to_none=True)
        F.cross_entropy(self.anchor(x), y).backward()
        with torch.no_grad():
            for param, at_anchor, c in zip(model.parameters(), self.anchor.parameters(), self.correction):
                param.grad.sub_(at_anchor.grad).add_(c)
        return loss.detach()


@torch.no_grad()
def _add_momentum(params: list[nn.Parameter], inputs: list[torch.Tensor], beta: float, dampened: bool) -> None:
    for param, state in zip(params, inputs):
        if dampened:
            param.grad.mul_(1.0 - beta)
        param.grad.add_(state, alpha=beta)


def momentum_term(model: nn.Module, state: Mapping[str, torch.Tensor], beta: float, dampened: bool) -> GradientTerm:
    """The server's momentum m, frozen for the round: g ← β·m + g (or (1 − β)·g + β·m)."""
    device = next(model.parameters()).device
    inputs = [state[name].to(device) for name, _ in model.named_parameters()]
    return GradientTerm(f"mime beta={beta!r} dampened={dampened}",
                        lambda params, values: _add_momentum(params, values, beta, dampened), inputs)


def server_momentum(model: nn.Module, content: RecordDict, state: RecordDict) -> ClientComponent | None:
    """MIME/MimeLite: the server optimiser's frozen momentum, in every step."""
    if protocol.MIME_STATE not in content:
        return None
    config = content["config"]
    return FixedTerms(momentum_term(model, content[protocol.MIME_STATE].to_torch_state_dict(),
                                    float(config[protocol.MIME_MOMENTUM]), bool(config[protocol.MIME_DAMPENED])))


def mime_objective(settings: Mapping, model: nn.Module, state: RecordDict, rng, records: Mapping) -> MimeObjective:
    """MIME's corrected gradient needs c, sent beside the model."""
    return MimeObjective(model, records[protocol.MIME_CORRECTION].to_torch_state_dict())
