"""Every method's client half, handed to the client side at start-up.

clients/ never imports strategies/ (the layers: partitions → clients → strategies →
experiments). The registry that joins a method's two halves, strategies/methods/registry.py,
sits above both. What runs client code hands the registry's client halves over here
(``strategies.methods.registry.hand_over_client_halves``: the ServerApp, the commands that train
in-process, the test suite), never by being imported; the ClientApp that Flower loads
(strategies/client_app.py) provides a loader of the registry without importing it, so a
client process imports the methods (and torch) only with its first training message. The client code (clients/local_round.py,
clients/models/) reads them with :func:`installed`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from flwr.app import RecordDict
    from torch import nn

    from clients.components import Builder
    from clients.training import LocalObjective

    # A method's local objective, built per round from (the objective's settings from the round
    # config, model, client state, rng, the message's content).
    ObjectiveBuilder = Callable[[Mapping[str, Any], nn.Module, RecordDict, np.random.Generator, Mapping[str, Any]],
                                LocalObjective]


@dataclass(frozen=True)
class ClientHalves:
    objectives: Mapping[str, ObjectiveBuilder]  # local objectives by the name a round config sends
    components: tuple[Builder, ...]  # every client-component builder, each once
    projection_head: frozenset[str]  # methods that train with a projection head where a model has one
    option_keys: Mapping[str, tuple[str, ...]]  # each method's run-config keys (a client's ClientInfo holds them)


_loader: Callable[[], ClientHalves] | None = None
_halves: ClientHalves | None = None


def provide(loader: Callable[[], ClientHalves]) -> None:
    """Hand over the client halves: ``loader`` is called once, when client code first asks
    (handing the same loader over again keeps what it gave)."""
    global _loader, _halves
    if loader is not _loader:
        _loader, _halves = loader, None


def installed() -> ClientHalves:
    global _halves
    if _halves is None:
        if _loader is None:
            raise RuntimeError("the methods' client halves were not handed over: import strategies.methods.registry "
                               "(the registry above both halves) before running client code")
        _halves = _loader()
    return _halves
