"""SCAFFOLD, client side (Karimireddy et al., ICML 2020, Algorithm 1; METHODS.md §2.2).

Local step: w ← w − η (g − c_i + c), with c the server's control variate and c_i this
client's, kept across rounds in ``context.state``. After K steps, option II:
c_i⁺ = c_i − c + (w^t − w_i)/(K·η); the client sends Δc_i = c_i⁺ − c_i and keeps c_i⁺.
Option II estimates the mean local gradient from the distance travelled in K plain SGD
steps; with client momentum β that distance, and so c_i, is inflated by up to 1/(1 − β).
The paper uses plain SGD (``momentum = 0``); Basin applies the formula as written.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

STATE_KEY = "scaffold-client-control"
SERVER_CONTROL_KEY = "scaffold-control"
DELTA_KEY = "scaffold-delta-control"


def client_control_update(
    client_control: dict[str, torch.Tensor],
    server_control: dict[str, torch.Tensor],
    global_weights: dict[str, torch.Tensor],
    local_weights: dict[str, torch.Tensor],
    num_steps: int,
    lr: float,
) -> dict[str, torch.Tensor]:
    """Option II: c_i⁺ = c_i − c + (w^t − w_i)/(K·η)."""
    scale = 1.0 / (num_steps * lr)
    return {
        k: client_control[k] - server_control[k] + (global_weights[k] - local_weights[k]) * scale
        for k in client_control
    }


class ScaffoldClient:
    """One round of SCAFFOLD on a client: the gradient correction and the control update."""

    def __init__(self, model: nn.Module, server_control: ArrayRecord, state: RecordDict):
        self.names = [name for name, _ in model.named_parameters()]
        device = next(model.parameters()).device
        self.server_control = {k: v.to(device) for k, v in server_control.to_torch_state_dict().items()}
        stored = state.get(STATE_KEY)
        self.client_control = (
            {k: v.to(device) for k, v in stored.to_torch_state_dict().items()}
            if stored is not None
            else {k: torch.zeros_like(v) for k, v in self.server_control.items()}
        )
        self.global_weights = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.correction = [self.server_control[n] - self.client_control[n] for n in self.names]
        self.state = state

    @torch.no_grad()
    def hook(self, params: list[nn.Parameter]) -> None:
        """g ← g − c_i + c."""
        for param, correction in zip(params, self.correction):
            param.grad.add_(correction)

    def control_norm(self) -> float:
        return float(torch.sqrt(sum((v.double() ** 2).sum() for v in self.client_control.values())))

    def finish(self, model: nn.Module, num_steps: int, lr: float) -> ArrayRecord:
        """Store c_i⁺ in the client state and return Δc_i for the server."""
        local = {n: p.detach() for n, p in model.named_parameters()}
        updated = client_control_update(
            self.client_control, self.server_control, self.global_weights, local, num_steps, lr
        )
        self.state[STATE_KEY] = ArrayRecord({k: v.cpu() for k, v in updated.items()})
        return ArrayRecord({k: (updated[k] - self.client_control[k]).cpu() for k in updated})
