"""The one local training loop, and evaluation, on device-resident tensors.

Data sets are small, so a client's partition lives on the training device and batches
are index slices of it: no DataLoader, no per-step host→device copies, and the loss is
accumulated on the device and read once per round (no per-step synchronisation).

Local SGD (PyTorch's ``torch.optim.SGD``): for each epoch, a seeded permutation of the
partition is cut into batches; per batch g = ∇ CE(w; batch) (clipped to ``grad_clip`` in
global 2-norm when > 0), then the SGD update with momentum and weight decay at the
round's learning rate. The momentum buffer starts at zero every round.

Methods that change the local objective add terms to g through *gradient hooks*, called
after each backward pass and before clipping: FedProx (Li et al. 2020, eq. 2) adds
μ(w − w^t), the gradient of (μ/2)‖w − w^t‖²; SCAFFOLD adds c − c_i (clients/scaffold.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class LocalTrainingConfig:
    """The hyperparameters a client receives with a round's training message."""

    lr: float
    local_epochs: int
    batch_size: int
    momentum: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float = 0.0


@dataclass(frozen=True)
class LocalTrainingResult:
    mean_loss: float
    num_steps: int
    num_examples: int


def train_local(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: LocalTrainingConfig,
    generator: torch.Generator,
    gradient_hooks: Sequence[Callable[[list[nn.Parameter]], None]] = (),
) -> LocalTrainingResult:
    """Run local SGD on (x, y), which live on the model's device; return loss and steps.

    Each of ``gradient_hooks`` is called with the parameters after every backward pass.
    """
    model.train()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )
    params = list(model.parameters())
    num_examples = len(y)
    loss_sum = torch.zeros((), device=x.device)
    steps = 0
    for _ in range(config.local_epochs):
        # The permutation is drawn on the CPU generator so it is identical on any device.
        order = torch.randperm(num_examples, generator=generator).to(x.device)
        for start in range(0, num_examples, config.batch_size):
            batch = order[start : start + config.batch_size]
            loss = F.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            for hook in gradient_hooks:
                hook(params)
            if config.grad_clip > 0:
                nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            loss_sum += loss.detach()
            steps += 1
    return LocalTrainingResult(float(loss_sum) / max(steps, 1), steps, num_examples)


def proximal_hook(model: nn.Module, mu: float) -> Callable[[list[nn.Parameter]], None]:
    """FedProx's hook, anchored at the model's current (global) weights."""
    anchors = [p.detach().clone() for p in model.parameters()]
    return lambda params: add_proximal_gradient(params, anchors, mu)


@torch.no_grad()
def add_proximal_gradient(params, anchors: list[torch.Tensor], mu: float) -> None:
    """g ← g + μ(w − w^t): the gradient of FedProx's (μ/2)‖w − w^t‖²."""
    for param, anchor in zip(params, anchors):
        param.grad.add_(param - anchor, alpha=mu)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 2048) -> tuple[float, float]:
    """Mean cross-entropy and top-1 accuracy of ``model`` on (x, y)."""
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=x.device)
    correct = torch.zeros((), dtype=torch.int64, device=x.device)
    for start in range(0, len(y), batch_size):
        logits = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        loss_sum += F.cross_entropy(logits, target, reduction="sum").double()
        correct += (logits.argmax(dim=1) == target).sum()
    return float(loss_sum) / len(y), float(correct) / len(y)


def select_device(preference: str) -> torch.device:
    """'auto' → CUDA when available, else CPU; 'cuda' fails clearly without a GPU."""
    if preference == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device = 'cuda' but no CUDA device is available")
    if preference == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")
