"""MOON: model-contrastive federated learning (Li, He, Song, CVPR 2021, eqs. 1–3).

Local loss: CE(F(x), y) + μ·ℓ_con with
ℓ_con = −log( exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) ),
z the representation of the model being trained, z_glob that of the received global
model and z_prev that of this client's model after its previous round (kept in
``context.state``; the global model stands in before the client's first round, as in the
authors' code), sim the cosine similarity, τ = 0.5.

The representation is the input of the model's classifier (``model.represent``): for the
CNNs and the ResNet-18/VGG-11 heads this is the output of their MLP head, which plays the
role of MOON's projection head. Three models are held in memory during local training.
The two frozen models are the step's round state (``LocalObjective.adopt``): a step
replayed as a CUDA graph reads the first round's copies, into which each round loads its
models.
"""

from __future__ import annotations

import copy

import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn
from torch.nn import functional as F

from clients.protocol import MOON_PREVIOUS_MODEL
from clients.training import LocalObjective


def contrastive_loss(z: torch.Tensor, z_global: torch.Tensor, z_previous: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over the batch of MOON's ℓ_con: cross-entropy with the global model as positive."""
    logits = torch.stack(
        [F.cosine_similarity(z, z_global, dim=-1), F.cosine_similarity(z, z_previous, dim=-1)], dim=1
    ) / temperature
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


class Moon(LocalObjective):
    capturable = True  # two extra forwards under no_grad, static shapes
    round_state = ("global_model", "previous_model")

    def __init__(self, model: nn.Module, state: RecordDict, mu: float = 1.0, temperature: float = 0.5):
        self.mu = mu
        self.temperature = temperature
        self.state = state
        self.global_model = frozen_copy(model)
        self.previous_model = frozen_copy(model)
        stored = state.get(MOON_PREVIOUS_MODEL)
        if stored is not None:
            self.previous_model.load_state_dict(stored.to_torch_state_dict())

    def signature(self) -> tuple:
        return (self.mu, self.temperature)

    def backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = model.represent(x)
        with torch.no_grad():
            z_global = self.global_model.represent(x)
            z_previous = self.previous_model.represent(x)
        loss = F.cross_entropy(model.classifier(z), y) + self.mu * contrastive_loss(
            z, z_global, z_previous, self.temperature
        )
        loss.backward()
        return loss.detach()

    def finish(self, model: nn.Module) -> None:
        self.state[MOON_PREVIOUS_MODEL] = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})


def frozen_copy(model: nn.Module) -> nn.Module:
    clone = copy.deepcopy(model).eval()
    for param in clone.parameters():
        param.requires_grad_(False)
    return clone


def moon_objective(settings, model: nn.Module, state: RecordDict, rng, records) -> Moon:
    """MOON's objective with the round's μ and τ (the declaration: strategies/moon.py)."""
    return Moon(model, state, float(settings["moon-mu"]), float(settings["moon-temperature"]))
