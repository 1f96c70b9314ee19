"""One client round of any Basin method: the local objective, gradient hooks and client
state a training message asks for, then the local SGD and the reply's extra records.

Used by the ClientApp and by the cost benchmark (experiments/costs.py), so both run
exactly the same local computation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from clients import protocol
from clients.augmentation import CropFlip
from clients.client_info import ClientInfo
from clients.client_step import step_mode
from clients.halves import installed
from clients.training import CrossEntropy, LocalObjective, LocalTrainingConfig, LocalTrainingResult, momentum_a_norm, train_local


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
        step_budget=int(round_config.get(protocol.STEP_BUDGET, 0)),
    )


def batch_augmentation(round_config: Mapping[str, Any]) -> CropFlip | None:
    """The round's data augmentation (``augment``), or None."""
    if str(round_config.get("augment", "none")) == "none":
        return None
    return CropFlip(list(round_config[protocol.AUGMENT_PAD]))


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


def build_objective(name: str, content: RecordDict, model: nn.Module, state: RecordDict,
                    rng: np.random.Generator) -> LocalObjective:
    """The local objective the round names (its method's declaration builds it), or
    cross-entropy when it names none."""
    if name in ("", "cross-entropy"):
        return CrossEntropy()
    builders = installed().objectives
    if name not in builders:
        raise ValueError(f"unknown local objective {name!r}; allowed: {', '.join(builders)}")
    return builders[name](content["config"], model, state, rng, content)


class LocalRound:
    """The method-specific parts of one round, built from the training message's content:
    the local objective, and the client components the message asks for
    (clients/components.py), whose gradient terms every step adds and which store their
    state and add their records after the round. Each sees ``client`` (what the client knows
    of itself, clients/client_info.py) before the first step."""

    def __init__(self, model: nn.Module, content: RecordDict, state: RecordDict, rng: np.random.Generator,
                 client: ClientInfo):
        self.round_config = content["config"]
        self.client = client
        self.objective = build_objective(str(self.round_config.get(protocol.OBJECTIVE, "")), content, model, state, rng)
        self.components = [component for build in installed().components if (component := build(model, content, state))]
        for part in (self.objective, *self.components):  # what the client knows, before the first step
            part.see_client(client)

    def train(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator) -> LocalTrainingResult:
        config = training_config(self.round_config)
        hooks, post_clip_hooks = self.gradient_terms(config, len(y))
        return train_local(
            model, x, y, config, generator, hooks, self.objective,
            batch_augmentation(self.round_config), post_clip_hooks,
            graphs=bool(self.round_config.get(protocol.CUDA_GRAPHS, True)),
        )

    def gradient_terms(self, config: LocalTrainingConfig, num_examples: int) -> tuple[list, list]:
        """The components' gradient terms, before and after clipping."""
        hooks = [term for component in self.components for term in component.gradient_terms(config, num_examples)]
        return hooks, [term for component in self.components for term in component.post_clip_terms()]

    def step_mode(self, device: torch.device, num_examples: int) -> tuple[str, str]:
        """(mode, why) of this round's local step on ``device`` (clients/client_step.py)."""
        hooks, post_clip_hooks = self.gradient_terms(training_config(self.round_config), num_examples)
        return step_mode(device, bool(self.round_config.get(protocol.CUDA_GRAPHS, True)), self.objective,
                         [*hooks, *post_clip_hooks])

    def finish(self, model: nn.Module, result: LocalTrainingResult) -> tuple[dict[str, float], dict[str, ArrayRecord]]:
        """Update the client state; return the reply's metrics and extra ArrayRecords."""
        self.objective.finish(model)
        metrics = {
            "num-examples": result.num_examples,
            "train-loss": result.mean_loss,
            "local-steps": result.num_steps,
            # The local solver's ‖a_i‖₁ (a server that normalises each update by it reads it).
            protocol.SOLVER_A_NORM: momentum_a_norm(result.num_steps, float(self.round_config["momentum"])),
        }
        records = {}
        if self.round_config.get(protocol.REPORT_LABEL_COUNTS, False):  # the server's method declares it asks
            records[protocol.LABEL_COUNTS_RECORD] = ArrayRecord({"counts": torch.tensor(self.client.label_counts)})
        extra = self.objective.reply_tensors()
        if extra:
            records[protocol.OBJECTIVE_RECORD] = ArrayRecord(extra)
        for component in self.components:
            component_metrics, component_records = component.finish(model, result)
            metrics.update(component_metrics)
            records.update(component_records)
        return metrics, records
