"""The client halves of server methods, behind one protocol the local round loops over.

A training message may ask a client for more than local SGD on its objective: a proximal
term (FedProx, FedACG), a control-variate correction (SCAFFOLD, FedMoSWA), the server's
momentum (MIME, MimeLite), a momentum direction (FedCM, MoFedSAM), FedDyn's or AdaBest's
terms. Each is a :class:`ClientComponent`:

- built from the round's message and the client's state (``context.state``) by its
  builder, which returns None when the message does not ask for it;
- :meth:`~ClientComponent.see_client`: what the client knows of itself (its label counts,
  …: clients/client_info.py), before the round's first step;
- :meth:`~ClientComponent.gradient_terms`: the terms it adds to each step's gradient
  before clipping (and :meth:`~ClientComponent.post_clip_terms` after), once the round's
  optimiser settings and the client's number of examples are known;
- :meth:`~ClientComponent.finish`: after local training, what it stores in the client
  state, and the metrics and extra records it adds to the reply.

A method's builders live in its client module (clients/feddyn.py, …) and are named by its
declaration (``MethodSpec.client_components``); clients/local_round.py loops over the
declared builders and names no method. This module holds the protocol and the parts
several methods share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flwr.app import ArrayRecord, RecordDict
from torch import nn

from clients.client_info import ClientInfo
from clients.training import LocalTrainingConfig, LocalTrainingResult, proximal_hook


class ClientComponent:
    """A method's client half (see the module docstring); no-op defaults."""

    def see_client(self, client: ClientInfo) -> None:
        """Called once before the round's first step with what the client knows of itself
        (clients/client_info.py), as an objective's ``see_client`` is."""

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
