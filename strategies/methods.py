"""Every method Basin knows: the modules that declare one, and what is derived from them.

A method is declared once, in its own module (``METHODS = (MethodSpec(...),)``, see
clients/declarations.py); adding one is adding its module to :data:`METHOD_MODULES`. The
methods that only change the clients' local objective are declared together, in
clients/objectives/declarations.py, each objective in a module of its own. The order here
is the order of ``strategy``'s allowed values: server-side methods, then those.

    python -m strategies.methods --write-pyproject   # regenerate pyproject.toml's method keys
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import tomli_w

from clients.declarations import MethodSpec
from clients.halves import ClientHalves, provide
from clients.options import Option
from strategies.client_objective import objective_server
from strategies.method import AveragingSpec

if TYPE_CHECKING:
    from clients.components import Builder
    from clients.declarations import ObjectiveBuilder

METHOD_MODULES = (
    "strategies.fedavg", "strategies.fedavgm", "strategies.fedopt", "strategies.fedprox", "strategies.scaffold",
    "strategies.fednova", "strategies.feddyn", "strategies.fedgma", "strategies.fedswa", "strategies.fedcm",
    "strategies.fedacg", "strategies.mofedsam", "strategies.fedlesam", "strategies.adabest", "strategies.mime",
    "strategies.fedfa", "strategies.fedavg_clip",
    "clients.objectives.declarations",
)
# Averaging rules (the ``averaging`` key), each module ending with ``AVERAGINGS = (AveragingSpec(...),)``.
AVERAGING_MODULES = ("strategies.averaging", "strategies.ema")
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
BLOCK_START = "# -- method keys: generated from the methods' declarations by `python -m strategies.methods --write-pyproject`"
BLOCK_END = "# -- end of method keys"


def _load() -> dict[str, MethodSpec]:
    """Every declaration, a method that only changes the clients' objective given its
    server here (clients/ declares its half without importing strategies/)."""
    methods: dict[str, MethodSpec] = {}
    for module_name in METHOD_MODULES:
        for spec in importlib.import_module(module_name).METHODS:
            if spec.name in methods:
                raise ValueError(f"method {spec.name!r} is declared twice ({module_name})")
            methods[spec.name] = spec if spec.build is not None else dataclasses.replace(
                spec, build=objective_server(spec))
    return methods


METHODS: dict[str, MethodSpec] = _load()
AVERAGINGS: dict[str, AveragingSpec] = {
    rule.name: rule for module in AVERAGING_MODULES for rule in importlib.import_module(module).AVERAGINGS
}


def _declarations() -> list[MethodSpec | AveragingSpec]:
    return [*METHODS.values(), *AVERAGINGS.values()]


def method(name: str) -> MethodSpec:
    """The declaration of method ``name`` (a validated ``strategy`` value)."""
    return METHODS[name]


def method_options() -> dict[str, Option]:
    """Every method's and averaging rule's own run-config keys, in declaration order. A key
    shared by several must be the same Option (declared by one, imported by the others)."""
    options: dict[str, Option] = {}
    for spec in _declarations():
        for key, option in spec.options.items():
            if options.setdefault(key, option) is not option:
                raise ValueError(f"run-config key {key!r} is declared differently by {spec.name!r} and another method")
    return options


@cache  # asked by every client round: the declarations do not change in a process
def client_components() -> tuple[Builder, ...]:
    """Every declared client-component builder, each once. A message asks for one method's
    components only, so their order across methods does not matter; within a method it is
    its declaration's."""
    return tuple(dict.fromkeys(build for spec in METHODS.values() for build in spec.client_components))


@cache
def objective_builders() -> dict[str, ObjectiveBuilder]:
    """Local objectives by the name a round config sends (its method's name)."""
    return {spec.name: spec.objective for spec in METHODS.values() if spec.objective is not None}




def client_halves() -> ClientHalves:
    """What the client side needs of every method: objectives, components, who wants a projection head."""
    return ClientHalves(objective_builders(), client_components(),
                        frozenset(name for name, spec in METHODS.items() if spec.projection_head))


provide(client_halves)  # the client side reads them from clients/halves.py (clients/ does not import strategies/)


def pyproject_block() -> str:
    """The method keys of ``[tool.flwr.app.config]``, from the declarations (Flower accepts
    overrides only of keys that pyproject.toml declares)."""
    lines, seen = [BLOCK_START], set()
    for spec in _declarations():
        own = [key for key in spec.options if key not in seen]
        seen.update(own)
        if own:
            lines.append(f"# {spec.display_name}")
            lines += tomli_w.dumps({key: spec.options[key].default for key in own}).splitlines()
    return "\n".join([*lines, BLOCK_END])


def write_pyproject(path: Path = PYPROJECT) -> bool:
    """Replace the generated block of ``path``; True when it changed."""
    text = path.read_text()
    pattern = re.compile(re.escape(BLOCK_START) + r".*?" + re.escape(BLOCK_END), re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"{path} has no generated block of method keys ({BLOCK_START!r} … {BLOCK_END!r})")
    new = pattern.sub(lambda _: pyproject_block(), text)
    if new != text:
        path.write_text(new)
    return new != text


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m strategies.methods", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-pyproject", action="store_true",
                        help="rewrite pyproject.toml's generated block of method keys")
    if parser.parse_args().write_pyproject:
        print("pyproject.toml " + ("updated" if write_pyproject() else "already up to date"))
    else:
        print("\n".join(f"{spec.name:18s} {spec.display_name}" for spec in METHODS.values()))
