"""Every method Basin knows: its own, and those of installed plug-ins; what is derived from them.

A method is declared once, in its own module, ending with ``METHODS = (MethodSpec(...),)``
(strategies/methods/method_spec.py) or, for an averaging rule, ``AVERAGINGS = (AveragingSpec(...),)``
(strategies/methods/averaging_spec.py). Basin's own modules are listed below; a researcher's live in their
own package, found by an entry point in the group ``basin.methods`` whose name is the
method's and whose value is the module that declares it (docs/extending.md). The order
here is the order of ``strategy``'s allowed values: server-side methods, then those that
only change the clients' objective, then plug-ins by name.

A plug-in that cannot be used (its module fails to import, its declaration is malformed,
its name or a key of it clashes with another method's, or a key of it is one of Basin's
general keys) is kept as a :class:`BrokenPlugin`: one line naming it, its distribution and
what is wrong, raised when a run asks for it and shown when methods are listed; every
other method runs.

``.venv/bin/python -m experiments.method_list`` lists them and regenerates the files derived
from the declarations.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from typing import TYPE_CHECKING, Any

from clients.declarations import import_plugin_module
from clients.halves import ClientHalves, provide
from clients.options import ConfigError, Option
from strategies.general_keys import GENERAL_KEY_NAMES
from strategies.methods.averaging_spec import AveragingSpec
from strategies.methods.method_spec import MethodSpec
from strategies.methods.objective_server import objective_server

if TYPE_CHECKING:
    from clients.components import Builder
    from clients.halves import ObjectiveBuilder

METHOD_MODULES = (
    "strategies.fedavg", "strategies.fedavgm", "strategies.fedopt", "strategies.fedprox", "strategies.scaffold",
    "strategies.fednova", "strategies.feddyn", "strategies.fedgma", "strategies.fedswa", "strategies.fedcm",
    "strategies.fedacg", "strategies.mofedsam", "strategies.fedlesam", "strategies.adabest", "strategies.mime",
    "strategies.fedfa", "strategies.fedavg_clip",
    # Methods that only change the clients' objective (their objectives: clients/objectives/).
    "strategies.moon", "strategies.sam", "strategies.fedalign", "strategies.mixup", "strategies.stochastic_depth",
    "strategies.gradaug", "strategies.label_smoothing",
)
# Averaging rules (the ``averaging`` key), each module ending with ``AVERAGINGS = (AveragingSpec(...),)``.
AVERAGING_MODULES = ("strategies.averaging", "strategies.ema")
ENTRY_POINT_GROUP = "basin.methods"

Declaration = MethodSpec | AveragingSpec


@dataclass(frozen=True)
class Plugin:
    """Where a plug-in's method comes from: its entry point's name and module, its distribution."""

    name: str
    module: str
    distribution: str
    # Its module imported torch when the launcher loaded it (Basin's launcher loads none:
    # declarations name their torch code with ImplementedIn, imported in the clients).
    imports_torch: bool = False

    def describe(self) -> str:
        return f"plug-in {self.name!r} (distribution {self.distribution}, module {self.module})"


@dataclass(frozen=True)
class BrokenPlugin:
    """A plug-in that cannot be used, and why."""

    plugin: Plugin
    problem: str

    def line(self) -> str:
        return f"{self.plugin.describe()} cannot be used: {self.problem}"


@dataclass(frozen=True)
class Registry:
    """The methods and averaging rules by name, the module declaring each, where each
    plug-in's came from, and the broken plug-ins."""

    methods: dict[str, MethodSpec]
    averagings: dict[str, AveragingSpec]
    modules: dict[str, str]
    plugins: dict[str, Plugin]
    broken: dict[str, BrokenPlugin]


def _given_its_server(spec: MethodSpec) -> MethodSpec:
    """A method that only changes the clients' objective gets its server here: FedAvg sending
    the objective (clients/ declares its half without importing strategies/)."""
    return spec if spec.build is not None else dataclasses.replace(spec, build=objective_server(spec))


def _declarations_of(module: Any) -> list[Declaration]:
    declarations = [*getattr(module, "METHODS", ()), *getattr(module, "AVERAGINGS", ())]
    wrong = [repr(d) for d in declarations if not isinstance(d, (MethodSpec, AveragingSpec))]
    if wrong:
        raise TypeError(f"METHODS/AVERAGINGS hold something other than a MethodSpec or AveragingSpec: {wrong[0][:80]}")
    return declarations


def installed_plugins() -> list[Plugin]:
    """The entry points of the group ``basin.methods`` in this environment, by name."""
    plugins = []
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        distribution = entry_point.dist.name if entry_point.dist is not None else "an unknown distribution"
        plugins.append(Plugin(entry_point.name, entry_point.value, distribution))
    return sorted(plugins, key=lambda plugin: (plugin.name, plugin.distribution))


def _plugin_declaration(plugin: Plugin, entry_points_of_module: set[str]) -> Declaration:
    """The declaration a plug-in's entry point names, or an exception saying what is wrong
    (``entry_points_of_module``: the names of every entry point naming its module)."""
    declarations = _declarations_of(import_plugin_module(plugin.module))
    named = [d for d in declarations if d.name == plugin.name]
    if not named:
        declared = ", ".join(repr(d.name) for d in declarations) or "nothing (no METHODS or AVERAGINGS)"
        raise ValueError(f"its module declares no method named {plugin.name!r} (it declares {declared})")
    unnamed = [d.name for d in declarations if d.name not in entry_points_of_module]
    if unnamed:
        raise ValueError(f"its module also declares {', '.join(map(repr, unnamed))}, which no entry point names "
                         f"(one entry point per method: add {unnamed[0]} = {plugin.module} to [project.entry-points."
                         f"\"{ENTRY_POINT_GROUP}\"])")
    if isinstance(named[0], MethodSpec) and (problem := _objective_keys_problem(named[0])):
        raise ValueError(problem)
    return named[0]


def _objective_keys_problem(spec: MethodSpec) -> str | None:
    """Why ``spec``'s ``objective_keys`` cannot be sent (a key it does not declare), or None."""
    unknown = [key for key in spec.objective_keys if key not in spec.options and key not in GENERAL_KEY_NAMES]
    if not unknown:
        return None
    return (f"its objective_keys name {', '.join(map(repr, unknown))}, which neither it (options) nor Basin "
            f"(`--list-keys`) declares")


def _shared_key_problem(declaration: Declaration, options: dict[str, Option]) -> str | None:
    for key, option in declaration.options.items():
        if key in GENERAL_KEY_NAMES:  # the method's own meaning would replace Basin's for every run
            return f"its run-config key {key!r} is one of Basin's general keys (`--list-keys`); name it after the method"
        if key in options and options[key] is not option:
            return f"its run-config key {key!r} is declared differently by another method"
    return None


def load_registry(plugins: Iterable[Plugin] | None = None) -> Registry:
    """Basin's declarations, then each plug-in's (those installed, or ``plugins``)."""
    methods: dict[str, MethodSpec] = {}
    averagings: dict[str, AveragingSpec] = {}
    modules: dict[str, str] = {}
    for module_name in (*METHOD_MODULES, *AVERAGING_MODULES):
        for declaration in _declarations_of(importlib.import_module(module_name)):
            table: dict[str, Any] = methods if isinstance(declaration, MethodSpec) else averagings
            if declaration.name in table:
                raise ValueError(f"method {declaration.name!r} is declared twice ({module_name})")
            if isinstance(declaration, MethodSpec) and (problem := _objective_keys_problem(declaration)):
                raise ValueError(f"method {declaration.name!r} ({module_name}): {problem}")
            table[declaration.name] = declaration
            modules[declaration.name] = module_name
    options: dict[str, Option] = {}
    builtins: list[Declaration] = [*methods.values(), *averagings.values()]
    for builtin in builtins:
        for key, option in builtin.options.items():
            options.setdefault(key, option)

    candidates = list(installed_plugins() if plugins is None else plugins)
    by_name: dict[str, list[Plugin]] = {}
    for plugin in candidates:
        by_name.setdefault(plugin.name, []).append(plugin)
    found: dict[str, Plugin] = {}
    broken: dict[str, BrokenPlugin] = {}
    entry_points_of: dict[str, set[str]] = {}
    for plugin in candidates:
        entry_points_of.setdefault(plugin.module, set()).add(plugin.name)
    for name, same_name in by_name.items():
        plugin = same_name[0]
        if len(same_name) > 1:
            others = ", ".join(p.distribution for p in same_name[1:])
            broken[name] = BrokenPlugin(plugin, f"its name is also a plug-in of {others}")
            continue
        if name in methods or name in averagings:
            broken[name] = BrokenPlugin(plugin, "its name is one of Basin's own methods")
            continue
        if name == "none":
            broken[name] = BrokenPlugin(plugin, "its name is the value that means no averaging rule "
                                                "(averaging = \"none\"); name it after the method")
            continue
        had_torch = "torch" in sys.modules
        try:
            declaration = _plugin_declaration(plugin, entry_points_of[plugin.module])
        except Exception as error:
            broken[name] = BrokenPlugin(plugin, str(error))
            continue
        if (problem := _shared_key_problem(declaration, options)) is not None:
            broken[name] = BrokenPlugin(plugin, problem)
            continue
        options.update(declaration.options)
        if isinstance(declaration, MethodSpec):
            methods[name] = declaration
        else:
            averagings[name] = declaration
        found[name] = dataclasses.replace(plugin, imports_torch=not had_torch and "torch" in sys.modules)
        modules[name] = plugin.module
    return Registry({name: _given_its_server(spec) for name, spec in methods.items()}, averagings, modules, found,
                    broken)


REGISTRY = load_registry()
METHODS_BY_NAME: dict[str, MethodSpec] = REGISTRY.methods
AVERAGINGS_BY_NAME: dict[str, AveragingSpec] = REGISTRY.averagings
BROKEN_PLUGINS: dict[str, BrokenPlugin] = REGISTRY.broken


def declarations() -> list[Declaration]:
    return [*METHODS_BY_NAME.values(), *AVERAGINGS_BY_NAME.values()]


def method(name: str) -> MethodSpec:
    """The declaration of method ``name`` (a validated ``strategy`` value)."""
    return METHODS_BY_NAME[name]


def refuse_broken_plugin(key: str, value: Any) -> None:
    """Raise ConfigError when ``value`` of ``strategy`` or ``averaging`` names a broken plug-in."""
    if isinstance(value, str) and value in BROKEN_PLUGINS:
        raise ConfigError(f"run config key '{key}' = {value!r}: {BROKEN_PLUGINS[value].line()}")


def method_options() -> dict[str, Option]:
    """Every method's and averaging rule's own run-config keys, in declaration order. A key
    shared by several must be the same Option (declared by one, imported by the others)."""
    options: dict[str, Option] = {}
    for spec in declarations():
        for key, option in spec.options.items():
            if options.setdefault(key, option) is not option:
                raise ValueError(f"run-config key {key!r} is declared differently by {spec.name!r} and another method")
    return options


def plugin_defaults() -> dict[str, Any]:
    """The run-config keys that plug-ins add, with their defaults (pyproject.toml holds Basin's own)."""
    own = {key for spec in declarations() if spec.name not in REGISTRY.plugins for key in spec.options}
    return {key: option.default for key, option in method_options().items() if key not in own}


def end_to_end_runs() -> dict[str, dict[str, Any]]:
    """Every declared smoke run (tests/test_end_to_end.py): name → run-config overrides."""
    runs: dict[str, dict[str, Any]] = {}
    for spec in METHODS_BY_NAME.values():
        runs.update(spec.end_to_end_runs())
    for rule in AVERAGINGS_BY_NAME.values():
        runs.update({name: dict(overrides) for name, overrides in rule.smoke_runs.items()})
    return runs


@cache  # asked by every client round: the declarations do not change in a process
def client_components() -> tuple[Builder, ...]:
    """Every declared client-component builder, each once. A message asks for one method's
    components only, so their order across methods does not matter; within a method it is
    its declaration's."""
    return tuple(dict.fromkeys(build for spec in METHODS_BY_NAME.values() for build in spec.client_components))


@cache
def objective_builders() -> dict[str, ObjectiveBuilder]:
    """Local objectives by the name a round config sends (its method's name)."""
    return {spec.name: spec.objective for spec in METHODS_BY_NAME.values() if spec.objective is not None}


def client_halves() -> ClientHalves:
    """What the client side needs of every method: objectives, components, who wants a projection head."""
    return ClientHalves(objective_builders(), client_components(),
                        frozenset(name for name, spec in METHODS_BY_NAME.items() if spec.projection_head),
                        {name: tuple(spec.options) for name, spec in METHODS_BY_NAME.items()})


def hand_over_client_halves() -> None:
    """Give the client side (clients/halves.py, which may not import strategies/) every
    method's client half: called where client code runs in a process (the ServerApp, a
    command that trains in-process, the test suite), never by importing a module."""
    provide(client_halves)
