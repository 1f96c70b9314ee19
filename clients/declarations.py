"""What every plug-in declaration (a method's, a model's) shares in the client layer: the
error a malformed one raises, the import of a plug-in's module, and :class:`ImplementedIn`,
a client half named by where it is defined.

The declaration types themselves sit with what reads them: a method's (``MethodSpec``,
``objective_method``, ``TableRow``) and an averaging rule's (``AveragingSpec``) in
strategies/methods/, a model's (``ModelSpec``) in clients/model_plugins.py.

A client half is imported when first called: a declaration loads no torch, so the
launcher validates a run against every declaration before Flower starts without
importing it (a test keeps it torch-free; what that saves: docs/speed.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from clients.flower_internals import resolve

# Where the method declaration types went, for a plug-in that imports them from here.
MOVED_TO_STRATEGIES_METHODS = ("MethodSpec", "TableRow", "objective_method")


def __getattr__(name: str) -> Any:
    if name in MOVED_TO_STRATEGIES_METHODS:
        raise ImportError(f"{name} is in strategies.methods now: from strategies.methods import {name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class DeclarationError(ValueError):
    """A declaration (MethodSpec, AveragingSpec, ModelSpec) that is malformed, raised as it is built."""


def import_plugin_module(module_name: str) -> Any:
    """The module an entry point of a plug-in (a method's, a model's) names, imported; any
    failure of it (``sys.exit`` included, but not KeyboardInterrupt) is the plug-in's, raised
    as one line saying what went wrong."""
    if ":" in module_name:
        raise ValueError(f"the entry point's value must be a module (no ':'): {module_name!r}")
    try:
        return importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except DeclarationError as error:
        raise ValueError(f"a declaration of its module is malformed: {error}") from error
    except BaseException as error:  # any failure of a researcher's module is that plug-in's
        raise ImportError(f"importing it failed: {type(error).__name__}: {error}") from error


@dataclass(frozen=True)
class ImplementedIn:
    """A builder of a method's client half named by where it is defined: ``target`` is
    ``"module:name"``; with ``arguments``, the named function makes the builder
    (``control_variate(server key)``). The module is imported at the first call. Equal
    when they name the same builder, so a builder two methods share is built once per
    message (:func:`strategies.methods.registry.client_components`)."""

    target: str
    arguments: tuple[Any, ...] = ()

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    def __call__(self, *args: Any) -> Any:
        return _implementation(self.target, self.arguments)(*args)


@cache
def _implementation(target: str, arguments: tuple[Any, ...]) -> Callable[..., Any]:
    implementation = resolve(target)
    return implementation(*arguments) if arguments else implementation


