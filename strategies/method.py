"""A method's declaration, and an averaging rule's: everything Basin needs to know about
it, in one place.

Each method's own module ends with ``METHODS = (MethodSpec(...), ...)``; strategies/methods.py
lists those modules, and every table that used to name methods — the registry, config
validation and ``--list-keys``, the checkpoint, reports, the cost table, the clients'
objectives and components — iterates over the declarations instead.

A declaration says:

- ``name`` (the ``strategy`` value) and ``display_name`` (as its paper writes it);
- ``build``: the validated run config → the server strategy (Flower's Message API); use
  :data:`COHORT` for the arguments every Basin strategy shares;
- ``options``: the run-config keys it adds, each an :class:`~strategies.options.Option`
  with its default (``pyproject.toml``'s table of method keys is generated from these:
  ``python -m strategies.methods --write-pyproject``); a key two methods share is the same
  ``Option`` object, declared by one and imported by the other;
- ``check``: constraints on other keys, raising :class:`~strategies.options.ConfigError`;
- its client half: ``objective`` (what each client minimises, sent by name with the values
  of ``objective_keys``) and ``client_components`` (builders of
  :class:`~clients.components.ClientComponent`); ``client_state`` when clients keep
  state across rounds (checkpoints then snapshot it);
- what it needs: ``plain_sgd`` (its paper steps with plain SGD: no client momentum),
  ``model_needs`` ("image": one label per image; "slimmable-residual"), and
  ``default_server_lr`` (``server-lr = 0``);
- ``projection_head``: on the models that have one to add (FedAlign's ResNet-56), train
  with a two-layer projection head (MOON);
- ``cost_table``: its rows in ``python -m experiments.costs``'s default table, each a name
  and the run-config keys it sets besides ``strategy`` (GradAug's n = 1 and n = 2).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from strategies.options import Option

if TYPE_CHECKING:
    import numpy as np
    from flwr.app import RecordDict
    from torch import nn

    from clients.components import Builder
    from clients.training import LocalObjective
    from strategies.round_interface import RoundStrategy

    # (the objective's settings from the round config, model, client state, rng, the message's content)
    ObjectiveBuilder = Callable[[Mapping[str, Any], nn.Module, RecordDict, np.random.Generator, Mapping[str, Any]],
                                LocalObjective]

# Every Basin strategy addresses exactly the sampled cohort (fraction 1, no minimum), and
# federated evaluation is off: the ServerApp evaluates the global model centrally.
COHORT: dict[str, Any] = dict(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=0, min_available_nodes=0)
MODEL_NEEDS = ("any", "image", "slimmable-residual")


@dataclass(frozen=True)
class MethodSpec:
    """One method's declaration (see the module docstring)."""

    name: str
    display_name: str
    build: Callable[[Mapping[str, Any]], RoundStrategy]
    options: Mapping[str, Option] = field(default_factory=dict)
    check: Callable[[Mapping[str, Any]], None] | None = None
    objective: ObjectiveBuilder | None = None
    objective_keys: tuple[str, ...] = ()
    client_components: tuple[Builder, ...] = ()
    client_state: bool = False
    plain_sgd: bool | Callable[[Mapping[str, Any]], bool] = False
    model_needs: str = "any"
    default_server_lr: float = 1.0
    projection_head: bool = False
    cost_table: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model_needs not in MODEL_NEEDS:
            raise ValueError(f"{self.name}: model_needs = {self.model_needs!r}; allowed: {', '.join(MODEL_NEEDS)}")
        missing = [key for key, option in self.options.items() if option.default is None]
        if missing:
            raise ValueError(f"{self.name}: option(s) {', '.join(missing)} declare no default")

    def steps_plain_sgd(self, config: Mapping[str, Any]) -> bool:
        """Whether this run of the method steps with plain SGD (client momentum must be 0)."""
        return self.plain_sgd(config) if callable(self.plain_sgd) else self.plain_sgd

    def server_lr(self, config: Mapping[str, Any]) -> float:
        """``server-lr``, or the method's default when it is 0."""
        return config["server-lr"] or self.default_server_lr


def averaging_start_round(config: Mapping[str, Any]) -> int:
    """avg-start as a 1-based round: a fraction of num-rounds (rounded) or a round number."""
    start = config["avg-start"]
    if start < 1:
        return max(1, round(start * config["num-rounds"]))
    return int(start)


@dataclass(frozen=True)
class AveragingSpec:
    """An averaging rule's declaration (the ``averaging`` key's value ``name``): how it wraps
    the base method's strategy (``build(base, config)``, a
    :class:`~strategies.averaging.ModelAveraging`), its own run-config keys, constraints on
    other keys, and the first round whose reported model is an average (figures mark it).
    Rules live in strategies/averaging.py (IMA, WIMA, SWA) and their own modules
    (strategies/ema.py), listed in strategies/methods.py's ``AVERAGING_MODULES``."""

    name: str
    display_name: str
    build: Callable[[Any, Mapping[str, Any]], Any]
    options: Mapping[str, Option] = field(default_factory=dict)
    check: Callable[[Mapping[str, Any]], None] | None = None
    first_average: Callable[[Mapping[str, Any]], int] = averaging_start_round

    def __post_init__(self) -> None:
        missing = [key for key, option in self.options.items() if option.default is None]
        if missing:
            raise ValueError(f"{self.name}: option(s) {', '.join(missing)} declare no default")
