"""One client round of any Basin method: the local objective, gradient hooks and client
state a training message asks for, then the local SGD and the reply's extra records.

Used by the ClientApp and by the cost benchmark (experiments/costs.py), so both run
exactly the same local computation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from clients import protocol
from clients.adabest import AdaBestClient
from clients.augmentation import crop_flip
from clients.control_variates import ControlVariateClient
from clients.fedcm import fedcm_term
from clients.feddyn import FedDynClient
from clients.mime import momentum_term
from clients.objectives import build_objective
from clients.training import LocalTrainingConfig, LocalTrainingResult, momentum_a_norm, proximal_hook, train_local

# Server records that carry a control variate → where the client keeps its own, the names
# of its reply records (Δc_i, and c_i⁺ when the method's server needs it) and what Δc_i is
# measured from (clients/control_variates.py).
CONTROL_VARIATES = {
    protocol.SCAFFOLD_SERVER_CONTROL: (protocol.SCAFFOLD_CLIENT_CONTROL, protocol.SCAFFOLD_DELTA_CONTROL, None, "client"),
    protocol.MOSWA_SERVER_CONTROL: (
        protocol.MOSWA_CLIENT_CONTROL, protocol.MOSWA_DELTA_CONTROL, protocol.MOSWA_NEW_CONTROL, "server"
    ),
}


def training_config(round_config: Mapping[str, Any]) -> LocalTrainingConfig:
    """The local optimizer settings of a round's config record."""
    return LocalTrainingConfig(
        lr=float(round_config["lr"]),
        local_epochs=int(round_config["local-epochs"]),
        batch_size=int(round_config["batch-size"]),
        momentum=float(round_config["momentum"]),
        weight_decay=float(round_config["weight-decay"]),
        grad_clip=float(round_config["grad-clip"]),
        local_steps=int(round_config.get(protocol.LOCAL_STEPS, 0)),
        step_lr_start=float(round_config.get(protocol.STEP_LR_START, 1.0)),
        step_lr_end=float(round_config.get(protocol.STEP_LR_END, 1.0)),
        nesterov=bool(round_config.get("nesterov", False)),
    )


def batch_augmentation(round_config: Mapping[str, Any]) -> Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None:
    """The round's data augmentation (``augment``), or None."""
    if str(round_config.get("augment", "none")) == "none":
        return None
    pad_value = torch.tensor(list(round_config[protocol.AUGMENT_PAD]), dtype=torch.float32)
    return lambda x, generator: crop_flip(x, generator, pad_value)


def round_randomness(seed: int, server_round: int, partition_id: int) -> tuple[torch.Generator, np.random.Generator]:
    """The batch-order generator and the objective's random generator of one client round.

    Both depend on (seed, round, partition) only, so a round is reproducible in any engine;
    torch's global generator (Stochastic Depth's drops) is seeded from the same triple.
    """
    round_seed = np.random.SeedSequence([seed, server_round, partition_id])
    generator = torch.Generator().manual_seed(int(round_seed.generate_state(1)[0]))
    objective_seed, torch_seed = round_seed.spawn(2)
    torch.manual_seed(int(torch_seed.generate_state(1)[0]))
    return generator, np.random.default_rng(objective_seed)


class LocalRound:
    """The method-specific parts of one round, built from the training message's content."""

    def __init__(self, model: nn.Module, content: RecordDict, state: RecordDict, rng: np.random.Generator):
        self.round_config = content["config"]
        self.objective = build_objective(
            str(self.round_config.get(protocol.OBJECTIVE, "cross-entropy")), self.round_config, model, state, rng,
            content,
        )
        self.hooks = []
        if float(self.round_config.get("proximal-mu", 0.0)) > 0:
            self.hooks.append(proximal_hook(model, float(self.round_config["proximal-mu"])))
        self.post_clip_hooks = []
        control_hooks = self.post_clip_hooks if self.round_config.get(protocol.CONTROL_AFTER_CLIP, False) else self.hooks
        self.controls = {}
        for server_key, (state_key, _, _, delta_reference) in CONTROL_VARIATES.items():
            if server_key in content:
                self.controls[server_key] = ControlVariateClient(
                    model, content[server_key], state, state_key, delta_reference
                )
                control_hooks.append(self.controls[server_key].hook)
        self.fedcm_direction = (
            content[protocol.FEDCM_DIRECTION].to_torch_state_dict() if protocol.FEDCM_DIRECTION in content else None
        )
        if protocol.MIME_STATE in content:  # the server optimizer's frozen momentum, in every step
            self.hooks.append(momentum_term(
                model, content[protocol.MIME_STATE].to_torch_state_dict(), float(self.round_config[protocol.MIME_MOMENTUM]),
                bool(self.round_config[protocol.MIME_DAMPENED]),
            ))
        self.adabest = None
        if protocol.ADABEST_MU in self.round_config:
            self.adabest = AdaBestClient(
                model, state, float(self.round_config[protocol.ADABEST_MU]), int(self.round_config["server-round"]),
                bool(self.round_config[protocol.ADABEST_OFFICIAL_CODE]),
                float(self.round_config[protocol.ADABEST_MEAN_EXAMPLES_PER_STEP]), int(self.round_config["local-epochs"]),
            )
        self.feddyn = None
        if protocol.FEDDYN_ALPHA in self.round_config:
            self.feddyn = FedDynClient(model, float(self.round_config[protocol.FEDDYN_ALPHA]), state)
            self.hooks.append(self.feddyn.hook)

    def train(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator) -> LocalTrainingResult:
        config = training_config(self.round_config)
        hooks = self.hooks
        if self.fedcm_direction is not None:  # Δ_t needs this client's K_i: known with its data
            alpha = float(self.round_config[protocol.FEDCM_ALPHA])
            per_client = self.round_config[protocol.FEDCM_SCALE] == "client"
            step_scale = 1.0 / (config.lr * config.num_steps(len(y))) if per_client else 1.0
            hooks = [fedcm_term(model, self.fedcm_direction, alpha, step_scale), *hooks]
        if self.adabest is not None:  # the official-code μ_ad needs this client's n_i
            hooks = [*hooks, self.adabest.term(len(y))]
        return train_local(
            model, x, y, config, generator, hooks, self.objective,
            batch_augmentation(self.round_config), self.post_clip_hooks,
            graphs=bool(self.round_config.get(protocol.CUDA_GRAPHS, True)),
        )

    def finish(self, model: nn.Module, result: LocalTrainingResult) -> tuple[dict[str, float], dict[str, ArrayRecord]]:
        """Update the client state; return the reply's metrics and extra ArrayRecords."""
        self.objective.finish(model)
        metrics = {
            "num-examples": result.num_examples,
            "train-loss": result.mean_loss,
            "local-steps": result.num_steps,
            # The local solver's ‖a_i‖₁ (FedNova normalises each update by it).
            protocol.FEDNOVA_A_NORM: momentum_a_norm(result.num_steps, float(self.round_config["momentum"])),
        }
        records = {}
        extra = self.objective.reply_tensors()
        if extra:
            records[protocol.OBJECTIVE_RECORD] = ArrayRecord(extra)
        for server_key, client in self.controls.items():
            _, delta_key, new_key, _ = CONTROL_VARIATES[server_key]
            metrics["client-state-norm"] = client.control_norm()  # c_i as the round started
            delta, new = client.finish(model, self.control_lr_sum(result))
            records[delta_key] = delta
            if new_key is not None:
                records[new_key] = new
        if self.adabest is not None:
            metrics["client-state-norm"] = self.adabest.state_norm()
            self.adabest.finish(model)
        if self.feddyn is not None:
            metrics["client-state-norm"] = self.feddyn.state_norm()
            self.feddyn.finish(model)
        return metrics, records

    def control_lr_sum(self, result) -> float:
        """Σ_k η_k, or (the constant in-round lr) × the step count the server names."""
        steps = int(self.round_config.get(protocol.CONTROL_STEP_COUNT, 0))
        if not steps or not result.num_steps:
            return result.lr_sum
        return result.lr_sum / result.num_steps * steps
