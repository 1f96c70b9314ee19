"""A method's declaration (:class:`MethodSpec`), in the words both its halves use.

Each method's own module ends with ``METHODS = (MethodSpec(...), ...)``; the registry
(strategies/methods/registry.py) lists those modules, and every table that names methods
(config validation and ``--list-keys``, the checkpoint, reports, the cost table, the
clients' objectives and components) iterates over the declarations instead. A method whose
only change is the clients' objective is declared with :func:`objective_method` in its
own torch-free module (strategies/moon.py, its objective in clients/objectives/moon.py);
the registry gives it its server (FedAvg sending the objective,
strategies/methods/objective_server.py). The client half is named where it is defined
(:class:`~clients.declarations.ImplementedIn`) and imported when first called, so a
declaration loads no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from clients.declarations import DeclarationError
from clients.options import Option

if TYPE_CHECKING:
    from clients.components import Builder
    from clients.halves import ObjectiveBuilder
    from strategies.round_interface import RoundStrategy

# What a method may need of the model: anything, one label per image, a residual network
# with width-slimmable stages.
MODEL_NEEDS = ("any", "image", "slimmable-residual")
# How a method's server turns the replies into its new model, as server-side DP needs to
# know (strategies/privacy.py): "mean", the mean of the replies' models; "step-on-mean", a
# server step (momentum, Adam) taking that mean as its input; "own", any other function of
# the replies (FedNova's normalisation, FedDyn's h, …), which DP's noise σ·C/m does not
# cover, so a run with dp-clipping-norm > 0 refuses it. The first two reach the mean only
# through strategies/weighted_mean.InPlaceFedAvg, where DP puts its private mean.
DP_AGGREGATES = ("mean", "step-on-mean", "own")
# How a method counts local steps when a client sends partial work (straggler-policy =
# partial, clients/system_speed.py: it runs τ of its K planned steps, on the planned lrs).
PARTIAL_WORK_RULES = {
    "steps-taken": "its step counts are the τ steps run: the reply's local-steps, FedNova's τ_i and ‖a_i‖₁, "
                   "SCAFFOLD's K·η as the sum of the τ steps' lrs, AdaBest's n/K",
    "planned-steps": "its per-client scale 1/(η·K_i) is set before the cut, with the K_i planned (FedCM's "
                     "per-client Δ_t); the reply's local-steps is τ",
    "fixed-count": "its control update divides by η·50 whatever ran (FedMoSWA's official code); the reply's "
                   "local-steps is τ",
}


def refuse_options_without_default(name: str, options: Mapping[str, Option]) -> None:
    """Raise DeclarationError when a declaration's own run-config key has no default."""
    missing = [key for key, option in options.items() if option.default is None]
    if missing:
        raise DeclarationError(f"{name}: option(s) {', '.join(missing)} declare no default")


@dataclass(frozen=True)
class TableRow:
    """A method's line in docs/methods.md's table (generated: ``python -m experiments.method_list
    --write-docs``): what it implements (paper, equation, its keys) and its default variant
    with the other options."""

    implements: str
    variants: str = "—"


@dataclass(frozen=True)
class MethodSpec:
    """One method's declaration:

    - ``name`` (the ``strategy`` value) and ``display_name`` (as its paper writes it);
    - ``build``: the validated run config → the server strategy (Flower's Message API); the
      strategies use ``strategies.cohort.COHORT`` for the arguments every Basin strategy shares;
    - ``options``: the run-config keys it adds, each an :class:`~clients.options.Option`
      with its default (``pyproject.toml``'s table of method keys is generated from these:
      ``python -m experiments.method_list --write-pyproject``); a key two methods share is the same
      ``Option`` object, declared by one and imported by the other;
    - ``check``: constraints on other keys, raising :class:`~clients.options.ConfigError`;
    - its client half: ``objective`` (what each client minimises, sent by name with the values
      of ``objective_keys``) and ``client_components`` (builders of
      :class:`~clients.components.ClientComponent`); ``client_state`` when clients keep
      state across rounds (checkpoints then snapshot it);
    - ``reply_records``: what its clients send the server besides their model, record name →
      what it holds (SCAFFOLD's Δc_i, FedFA's anchors, MIME's full-batch gradients). This is
      information leaving each client: a deployment reads here what its clients send.
      Server-side DP clips and noises the model update only, so a run with
      ``dp-clipping-norm`` > 0 refuses a method that declares any (strategies/config.py);
    - ``dp_aggregate``: how its server aggregates, one of :data:`DP_AGGREGATES` ("own" unless
      declared, so a method DP cannot vouch for is refused under DP; an objective-only
      method's server is FedAvg's mean);
    - what it needs: ``plain_sgd`` (its paper steps with plain SGD: no client momentum),
      ``model_needs`` ("image": one label per image; "slimmable-residual"), and
      ``default_server_lr`` (``server-lr = 0``);
    - ``partial_work``: how it counts local steps when a client sends partial work, one of
      :data:`PARTIAL_WORK_RULES` (or a function of the run config giving one, for a variant);
    - ``projection_head``: on the models that have one to add (FedAlign's ResNet-56), train
      with a two-layer projection head (MOON);
    - ``cost_table``: its rows in ``python -m experiments.costs``'s default table, each a name
      and the run-config keys it sets besides ``strategy`` (GradAug's n = 1 and n = 2);
    - ``table_row``: its line in docs/methods.md (None: it shares the line of the declaration
      before it in its module, FedYogi FedAdam's);
    - ``smoke_runs``: its real ``flwr run`` jobs in tests/test_end_to_end.py, each a name and
      the run-config keys it sets besides ``strategy`` on the suite's small setting (4
      clients, 3 rounds, the 8×8 digits); the smallest that still run every part of the
      method. Default: one run with nothing else set.
    """

    name: str
    display_name: str
    # None for a method that only changes the clients' objective: the registry
    # (strategies/methods/registry.py) gives it its server, FedAvg sending the objective.
    build: Callable[[Mapping[str, Any]], RoundStrategy] | None
    options: Mapping[str, Option] = field(default_factory=dict)
    check: Callable[[Mapping[str, Any]], None] | None = None
    objective: ObjectiveBuilder | None = None
    objective_keys: tuple[str, ...] = ()
    # An objective-only method's values sent beside its keys (None: the keys' run-config
    # values), and a gradient-norm clip of its own (FedAlign's 10) sent for the run's.
    objective_settings: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    objective_grad_clip: Callable[[Mapping[str, Any]], float] | None = None
    client_components: tuple[Builder, ...] = ()
    client_state: bool = False
    reply_records: Mapping[str, str] = field(default_factory=dict)
    dp_aggregate: str = "own"
    plain_sgd: bool | Callable[[Mapping[str, Any]], bool] = False
    model_needs: str = "any"
    default_server_lr: float = 1.0
    projection_head: bool = False
    partial_work: str | Callable[[Mapping[str, Any]], str] = "steps-taken"
    cost_table: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    smoke_runs: Mapping[str, Mapping[str, Any]] | None = None
    table_row: TableRow | None = None

    def __post_init__(self) -> None:
        if self.build is None and self.objective is None:
            raise DeclarationError(f"{self.name}: declares neither a server (build) nor a client objective")
        if self.model_needs not in MODEL_NEEDS:
            raise DeclarationError(f"{self.name}: model_needs = {self.model_needs!r}; allowed: {', '.join(MODEL_NEEDS)}")
        if self.dp_aggregate not in DP_AGGREGATES:
            raise DeclarationError(
                f"{self.name}: dp_aggregate = {self.dp_aggregate!r}; allowed: {', '.join(DP_AGGREGATES)}")
        refuse_options_without_default(self.name, self.options)

    def end_to_end_runs(self) -> dict[str, dict[str, Any]]:
        """Its smoke runs' run-config overrides, ``strategy`` included."""
        runs = {self.name: {}} if self.smoke_runs is None else self.smoke_runs
        return {name: {"strategy": self.name, **overrides} for name, overrides in runs.items()}

    def partial_work_rule(self, config: Mapping[str, Any]) -> str:
        """How this run of the method counts steps under partial work (:data:`PARTIAL_WORK_RULES`)."""
        rule = self.partial_work(config) if callable(self.partial_work) else self.partial_work
        if rule not in PARTIAL_WORK_RULES:
            raise DeclarationError(f"{self.name}: partial_work = {rule!r}; allowed: {', '.join(PARTIAL_WORK_RULES)}")
        return rule

    def steps_plain_sgd(self, config: Mapping[str, Any]) -> bool:
        """Whether this run of the method steps with plain SGD (client momentum must be 0)."""
        return self.plain_sgd(config) if callable(self.plain_sgd) else self.plain_sgd

    def server_lr(self, config: Mapping[str, Any]) -> float:
        """``server-lr``, or the method's default when it is 0."""
        return config["server-lr"] or self.default_server_lr


def objective_method(
    name: str, display_name: str, objective: ObjectiveBuilder, objective_keys: tuple[str, ...] = (),
    settings: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
    grad_clip: Callable[[Mapping[str, Any]], float] | None = None, **declaration: Any,
) -> MethodSpec:
    """The declaration of a method that only changes the clients' objective: its server is
    FedAvg sending ``objective_keys`` each round (``settings`` resolves their values from
    the run config when they need more than a copy, ``grad_clip`` a clip of the method's
    own), given by the registry; ``declaration`` holds the other :class:`MethodSpec` fields."""
    return MethodSpec(name, display_name, None, objective=objective, objective_keys=objective_keys,
                      objective_settings=settings, objective_grad_clip=grad_clip,
                      **{"dp_aggregate": "mean", **declaration})
