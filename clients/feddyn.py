"""FedDyn, client side (Acar et al., ICLR 2021, Algorithm 1).

Client k minimises L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)‖θ − θ^{t−1}‖², so its gradient
gets the hook g ← g − ∇L_k(θ_k^{t−1}) + α(θ − θ^{t−1}). After training, the first-order
condition of that objective gives the new linear term:
∇L_k(θ_k^t) ← ∇L_k(θ_k^{t−1}) − α(θ_k^t − θ^{t−1}), kept in ``context.state`` (zero
before the client's first round).
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from clients import protocol
from clients.client_step import GradientTerm
from clients.components import ClientComponent, StatefulTerm
from clients.protocol import FEDDYN_CLIENT_GRADIENT
from clients.state_store import stored_or_zeros


@torch.no_grad()
def add_feddyn_gradient(params: list[nn.Parameter], inputs: list[torch.Tensor], alpha: float) -> None:
    """g ← g − ∇L_k(θ_k^{t−1}) + α(θ − θ^{t−1}); ``inputs``: the linear terms, then θ^{t−1}."""
    linear_terms, global_weights = inputs[: len(params)], inputs[len(params):]
    for param, linear, anchor in zip(params, linear_terms, global_weights):
        param.grad.sub_(linear).add_(param - anchor, alpha=alpha)


class FedDynClient:
    """One round of FedDyn on a client."""

    def __init__(self, model: nn.Module, alpha: float, state: RecordDict):
        self.alpha = alpha
        self.state = state
        self.global_weights = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.linear_term = stored_or_zeros(state, FEDDYN_CLIENT_GRADIENT, self.global_weights)
        self.names = list(self.global_weights)
        self.hook = GradientTerm(
            f"feddyn alpha={alpha!r}", lambda params, inputs: add_feddyn_gradient(params, inputs, alpha),
            [self.linear_term[n] for n in self.names] + [self.global_weights[n] for n in self.names],
        )

    def state_norm(self) -> float:
        """‖∇L_k(θ_k^{t−1})‖ as the round starts (0 before the client's first round)."""
        return float(torch.sqrt(sum((v.double() ** 2).sum() for v in self.linear_term.values())))

    @torch.no_grad()
    def finish(self, model: nn.Module) -> None:
        """Store the new linear term for the client's next round."""
        updated = {
            n: self.linear_term[n] - self.alpha * (p.detach() - self.global_weights[n])
            for n, p in model.named_parameters()
        }
        self.state[FEDDYN_CLIENT_GRADIENT] = ArrayRecord({k: v.cpu() for k, v in updated.items()})


def feddyn_component(model: nn.Module, content: RecordDict, state: RecordDict) -> ClientComponent | None:
    config = content["config"]
    if protocol.FEDDYN_ALPHA not in config:
        return None
    client = FedDynClient(model, float(config[protocol.FEDDYN_ALPHA]), state)
    return StatefulTerm(client, lambda num_examples: client.hook)
