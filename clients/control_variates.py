"""Client control variates of SCAFFOLD and FedMoSWA (one implementation for both).

SCAFFOLD (Karimireddy et al., ICML 2020, Algorithm 1; METHODS.md §2.2): local step
w ← w − η(g − c_i + c) with the server's c; after K steps, option II:
c_i⁺ = c_i − c + (w^t − w_i)/(K·η).
FedMoSWA (ICML 2025, Algorithm 1; METHODS.md §1.4): the same with the server's m in place
of c and Σ_k η_k in place of K·η (its in-round lr decays): c_i⁺ = c_i − m + (θ^{t−1} − θ_{i,K})/Σ_k η_k.
Both keep c_i⁺ in ``context.state`` for the next round they are sampled in and send a
control difference, measured from a different point:
- SCAFFOLD sends Δc_i = c_i⁺ − c_i (its server adds (|S|/N)·mean Δc_i to c);
- FedMoSWA sends Δc_i = c_i⁺ − m (Algorithm 1 line 14, "Communicate (θ_{i,K}, c_i⁺ − m)"),
  so the server's m ← m + γ·mean Δc_i = (1 − γ)·m + γ·mean c_i⁺ is a momentum of the
  cohort's controls; FedMoSWA also sends c_i⁺ itself (the official-code variant's EMA).

Option II estimates the mean local gradient from the distance travelled in K plain SGD
steps; with client momentum β that distance, and so c_i, is inflated by up to 1/(1 − β).
The papers use plain SGD (``momentum = 0``); Basin applies the formula as written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from clients import protocol
from clients.client_step import GradientTerm
from clients.components import Builder, ClientComponent
from clients.state_store import stored_or_zeros
from clients.training import LocalTrainingConfig, LocalTrainingResult


def client_control_update(
    client_control: dict[str, torch.Tensor],
    server_control: dict[str, torch.Tensor],
    global_weights: dict[str, torch.Tensor],
    local_weights: dict[str, torch.Tensor],
    lr_sum: float,
) -> dict[str, torch.Tensor]:
    """Option II: c_i⁺ = c_i − c + (w^t − w_i)/Σ_k η_k (Σ_k η_k = K·η at a constant lr).

    Arrays that are not trained weights (BatchNorm running statistics: the server sends a
    control for every array of the model) keep their control, which stays 0."""
    return {
        k: client_control[k] - server_control[k] + (global_weights[k] - local_weights[k]) / lr_sum
        if k in global_weights
        else client_control[k]
        for k in client_control
    }


@torch.no_grad()
def add_correction(params: list[nn.Parameter], corrections: list[torch.Tensor]) -> None:
    """g ← g − c_i + c, with corrections c − c_i."""
    for param, correction in zip(params, corrections):
        param.grad.add_(correction)


DELTA_REFERENCES = ("client", "server")


class ControlVariateClient:
    """One round of a control-variate method on a client: the gradient correction and the
    control update. ``state_key`` names c_i in the client's ``context.state``;
    ``delta_reference`` is what the sent Δc_i is measured from: 'client' (c_i⁺ − c_i,
    SCAFFOLD) or 'server' (c_i⁺ − m, FedMoSWA)."""

    def __init__(
        self,
        model: nn.Module,
        server_control: ArrayRecord,
        state: RecordDict,
        state_key: str,
        delta_reference: str = "client",
    ):
        if delta_reference not in DELTA_REFERENCES:
            raise ValueError(f"delta_reference must be one of {DELTA_REFERENCES}, got {delta_reference!r}")
        self.delta_reference = delta_reference
        self.names = [name for name, _ in model.named_parameters()]
        device = next(model.parameters()).device
        self.server_control = {k: v.to(device) for k, v in server_control.to_torch_state_dict().items()}
        self.client_control = stored_or_zeros(state, state_key, self.server_control)
        self.global_weights = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.correction = [self.server_control[n] - self.client_control[n] for n in self.names]
        self.hook = GradientTerm("control variate", add_correction, self.correction)
        self.state = state
        self.state_key = state_key

    def state_norm(self) -> float:
        """‖c_i‖ as the round started (0 before the client's first round)."""
        return float(torch.sqrt(sum((v.double() ** 2).sum() for v in self.client_control.values())))

    def finish(self, model: nn.Module, lr_sum: float) -> tuple[ArrayRecord, ArrayRecord]:
        """Store c_i⁺ in the client state; return (Δc_i, c_i⁺) for the server."""
        local = {n: p.detach() for n, p in model.named_parameters()}
        updated = client_control_update(
            self.client_control, self.server_control, self.global_weights, local, lr_sum
        )
        new_control = ArrayRecord({k: v.cpu() for k, v in updated.items()})
        self.state[self.state_key] = new_control
        reference = self.client_control if self.delta_reference == "client" else self.server_control
        return ArrayRecord({k: (updated[k] - reference[k]).cpu() for k in updated}), new_control


class ControlVariate(ClientComponent):
    """SCAFFOLD's or FedMoSWA's control variate (clients/control_variates.py): its
    correction, then c_i⁺ stored and Δc_i (and c_i⁺ where the server needs it) sent."""

    # Server record → (where the client keeps c_i, its Δc_i record, its c_i⁺ record or None,
    # what Δc_i is measured from).
    RECORDS = {
        protocol.SCAFFOLD_SERVER_CONTROL: (protocol.SCAFFOLD_CLIENT_CONTROL, protocol.SCAFFOLD_DELTA_CONTROL, None, "client"),
        protocol.MOSWA_SERVER_CONTROL: (
            protocol.MOSWA_CLIENT_CONTROL, protocol.MOSWA_DELTA_CONTROL, protocol.MOSWA_NEW_CONTROL, "server"
        ),
    }

    def __init__(self, model: nn.Module, content: RecordDict, state: RecordDict, server_key: str):
        state_key, self.delta_key, self.new_key, reference = self.RECORDS[server_key]
        self.round_config: Mapping[str, Any] = content["config"]
        self.client = ControlVariateClient(model, content[server_key], state, state_key, reference)
        self.after_clip = bool(self.round_config.get(protocol.CONTROL_AFTER_CLIP, False))

    def gradient_terms(self, config: LocalTrainingConfig, num_examples: int) -> list:
        return [] if self.after_clip else [self.client.hook]

    def post_clip_terms(self) -> list:
        return [self.client.hook] if self.after_clip else []

    def finish(self, model: nn.Module, result: LocalTrainingResult) -> tuple[dict[str, float], dict[str, ArrayRecord]]:
        metrics = {"client-state-norm": self.client.state_norm()}  # c_i as the round started
        delta, new = self.client.finish(model, self.lr_sum(result))
        return metrics, {self.delta_key: delta, **({self.new_key: new} if self.new_key is not None else {})}

    def lr_sum(self, result: LocalTrainingResult) -> float:
        """Σ_k η_k, or (the constant in-round lr) × the step count the server names."""
        steps = int(self.round_config.get(protocol.CONTROL_STEP_COUNT, 0))
        if not steps or not result.num_steps:
            return result.lr_sum
        return result.lr_sum / result.num_steps * steps


def control_variate(server_key: str) -> Builder:
    def build(model: nn.Module, content: RecordDict, state: RecordDict) -> ClientComponent | None:
        return ControlVariate(model, content, state, server_key) if server_key in content else None

    return build
