"""The client halves of server methods, behind one protocol the local round loops over.

A training message may ask a client for more than local SGD on its objective: a proximal
term (FedProx, FedACG), a control-variate correction (SCAFFOLD, FedMoSWA), the server's
momentum (MIME, MimeLite), a momentum direction (FedCM, MoFedSAM), FedDyn's or AdaBest's
terms. Each is a :class:`ClientComponent`:

- built from the round's message and the client's state (``context.state``) by its
  builder, which returns None when the message does not ask for it;
- :meth:`~ClientComponent.gradient_terms`: the terms it adds to each step's gradient
  before clipping (and :meth:`~ClientComponent.post_clip_terms` after), once the round's
  optimiser settings and the client's number of examples are known;
- :meth:`~ClientComponent.finish`: after local training, what it stores in the client
  state, and the metrics and extra records it adds to the reply.

:data:`CLIENT_COMPONENTS` lists the builders, in the order their terms are added to a
gradient (the order is part of the arithmetic). A method's client half is a component in
its own module plus one entry here; clients/local_round.py names no method.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import ArrayRecord, RecordDict
from torch import nn

from clients import protocol
from clients.adabest import AdaBestClient
from clients.control_variates import ControlVariateClient
from clients.fedcm import fedcm_term
from clients.feddyn import FedDynClient
from clients.mime import momentum_term
from clients.training import LocalTrainingConfig, LocalTrainingResult, proximal_hook


class ClientComponent:
    """A method's client half (see the module docstring); no-op defaults."""

    def gradient_terms(self, config: LocalTrainingConfig, num_examples: int) -> list:
        return []

    def post_clip_terms(self) -> list:
        return []

    def finish(self, model: nn.Module, result: LocalTrainingResult) -> tuple[dict[str, float], dict[str, ArrayRecord]]:
        return {}, {}


Builder = Callable[[nn.Module, RecordDict, RecordDict], "ClientComponent | None"]


class FixedTerms(ClientComponent):
    """Gradient terms fixed when the round starts (FedProx's anchor, MIME's momentum)."""

    def __init__(self, *terms):
        self.terms = list(terms)

    def gradient_terms(self, config: LocalTrainingConfig, num_examples: int) -> list:
        return self.terms


def proximal(model: nn.Module, content: RecordDict, state: RecordDict) -> ClientComponent | None:
    """FedProx's μ(w − w^t) (also FedACG's β), anchored at the received model."""
    mu = float(content["config"].get("proximal-mu", 0.0))
    return FixedTerms(proximal_hook(model, mu)) if mu > 0 else None


def server_momentum(model: nn.Module, content: RecordDict, state: RecordDict) -> ClientComponent | None:
    """MIME/MimeLite: the server optimiser's frozen momentum, in every step."""
    if protocol.MIME_STATE not in content:
        return None
    config = content["config"]
    return FixedTerms(momentum_term(model, content[protocol.MIME_STATE].to_torch_state_dict(),
                                    float(config[protocol.MIME_MOMENTUM]), bool(config[protocol.MIME_DAMPENED])))


class MomentumDirection(ClientComponent):
    """FedCM/MoFedSAM: v = α·g + (1 − α)·Δ_t, Δ_t scaled by this client's K_i when per client."""

    def __init__(self, model: nn.Module, content: RecordDict):
        config = content["config"]
        self.model = model
        self.direction = content[protocol.FEDCM_DIRECTION].to_torch_state_dict()
        self.alpha = float(config[protocol.FEDCM_ALPHA])
        self.per_client = config[protocol.FEDCM_SCALE] == "client"

    def gradient_terms(self, config: LocalTrainingConfig, num_examples: int) -> list:
        step_scale = 1.0 / (config.lr * config.num_steps(num_examples)) if self.per_client else 1.0
        return [fedcm_term(self.model, self.direction, self.alpha, step_scale)]


def momentum_direction(model: nn.Module, content: RecordDict, state: RecordDict) -> ClientComponent | None:
    return MomentumDirection(model, content) if protocol.FEDCM_DIRECTION in content else None


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


class StatefulTerm(ClientComponent):
    """FedDyn's or AdaBest's client state: a gradient term, then the state updated."""

    def __init__(self, client, term: Callable[[int], Any]):
        self.client, self.term = client, term

    def gradient_terms(self, config: LocalTrainingConfig, num_examples: int) -> list:
        return [self.term(num_examples)]

    def finish(self, model: nn.Module, result: LocalTrainingResult) -> tuple[dict[str, float], dict[str, ArrayRecord]]:
        norm = self.client.state_norm()  # as the round started
        self.client.finish(model)
        return {"client-state-norm": norm}, {}


def feddyn(model: nn.Module, content: RecordDict, state: RecordDict) -> ClientComponent | None:
    config = content["config"]
    if protocol.FEDDYN_ALPHA not in config:
        return None
    client = FedDynClient(model, float(config[protocol.FEDDYN_ALPHA]), state)
    return StatefulTerm(client, lambda num_examples: client.hook)


def adabest(model: nn.Module, content: RecordDict, state: RecordDict) -> ClientComponent | None:
    config = content["config"]
    if protocol.ADABEST_MU not in config:
        return None
    client = AdaBestClient(
        model, state, float(config[protocol.ADABEST_MU]), int(config["server-round"]),
        bool(config[protocol.ADABEST_OFFICIAL_CODE]), float(config[protocol.ADABEST_MEAN_EXAMPLES_PER_STEP]),
        int(config["local-epochs"]),
    )
    return StatefulTerm(client, client.term)  # the official-code μ_ad needs this client's n_i


# In the order their gradient terms are added (as the methods were first implemented).
CLIENT_COMPONENTS: tuple[Builder, ...] = (
    momentum_direction, proximal, control_variate(protocol.SCAFFOLD_SERVER_CONTROL),
    control_variate(protocol.MOSWA_SERVER_CONTROL), server_momentum, feddyn, adabest,
)
