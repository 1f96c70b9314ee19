"""Local SGD with momentum, Nesterov and weight decay: ``torch.optim.SGD``'s fused update,
one kernel per device and dtype per step, without ``torch.optim``.

For each parameter w with gradient g, learning rate η (a one-element tensor, read by the
kernel at each step, so a captured CUDA graph reads each step's value), weight decay λ and
momentum μ (dampening 0):

    g ← g + λ·w
    b ← g                       on the first step (no buffer yet), else  b ← μ·b + g
    g ← g + μ·b  (Nesterov),    else  g ← b                              (when μ ≠ 0)
    w ← w − η·g

It calls the kernel ``torch.optim.SGD(..., fused=True)`` calls (``torch._fused_sgd_``)
with the same arguments, so parameters and momentum buffers are bitwise those of
``torch.optim.SGD`` (tests/test_client_step.py). Why not ``torch.optim`` itself: its
``step`` and ``zero_grad`` import ``torch._dynamo`` (with SymPy) on first use, 1.7 s on
an idle CPU core and 4–5 s while a run's processes start, paid by every client process
in its first round.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class FusedSgd:
    """SGD over ``params`` (see the module docstring); ``lr`` is a 0-d tensor on their device."""

    def __init__(self, params: Sequence[torch.nn.Parameter], lr: torch.Tensor, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        if momentum < 0 or weight_decay < 0:
            raise ValueError(f"momentum and weight decay must be >= 0, got {momentum} and {weight_decay}")
        if nesterov and momentum <= 0:
            raise ValueError("Nesterov momentum requires a momentum > 0")
        self.params = list(params)
        self.lr = lr
        self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov
        # Per parameter, its momentum buffer b once it has taken a step (momentum > 0 only).
        self.momentum_buffers: list[torch.Tensor | None] = [None] * len(self.params)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients, or zero them in place (a captured graph's own tensors)."""
        for param in self.params:
            if param.grad is None:
                continue
            if set_to_none:
                param.grad = None
            else:
                if param.grad.grad_fn is not None:
                    param.grad.detach_()
                else:
                    param.grad.requires_grad_(False)
                param.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        stepped = [i for i, param in enumerate(self.params) if param.grad is not None]
        if not stepped:
            return
        with_momentum = self.momentum != 0
        first_step = with_momentum and all(self.momentum_buffers[i] is None for i in stepped)
        if first_step:  # the kernel writes b ← g into these
            for i in stepped:
                self.momentum_buffers[i] = torch.empty_like(self.params[i].grad)
        groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for i in stepped:
            groups.setdefault((self.params[i].device, self.params[i].dtype), []).append(i)
        for group in groups.values():
            torch._fused_sgd_(
                [self.params[i] for i in group], [self.params[i].grad for i in group],
                [self.momentum_buffers[i] for i in group] if with_momentum else [],
                weight_decay=self.weight_decay, momentum=self.momentum, lr=self.lr, dampening=0.0,
                nesterov=self.nesterov, maximize=False, is_first_step=first_step, grad_scale=None, found_inf=None,
            )
