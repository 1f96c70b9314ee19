"""Models from a researcher's own package: entry points in the group ``basin.models``.

An entry point's name is the model's (the ``model`` key's value) and its value the module
that declares it: ``MODELS = (ModelSpec(...),)``. The declaration is torch-free (the
launcher checks a run against it before Flower starts): its builder is named where it is
defined (:class:`~clients.declarations.ImplementedIn`, ``"module:function"``) and imported
in the processes that build the model, called with (number of classes, input shape) and
returning a ``torch.nn.Module`` whose output is one logit per class.

What a model offers is declared too, and checked before Flower starts: ``inputs`` (``image``:
(C, H, W) tensors; ``sequence``: token ids) against the data set and the method, and
``offers``: ``classifier`` (its last layer is a linear module named ``classifier``) and
``represent`` (``model.represent(x)`` returns the classifier's input), which Basin's
methods that work on representations (``model_needs = "image"``: MOON, FedFA, …) use.

A plug-in that cannot be used (its module fails to import, declares no model of its name,
or its name is one of Basin's models) is kept as a :class:`BrokenModel`: one line naming it,
raised when a run asks for it and shown by ``--list-keys``; every other model runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from clients.declarations import DeclarationError, ImplementedIn, import_plugin_module
from clients.model_names import MODEL_NAMES

ENTRY_POINT_GROUP = "basin.models"
MODEL_INPUTS = ("image", "sequence")
MODEL_OFFERS = ("classifier", "represent")


@dataclass(frozen=True)
class ModelSpec:
    """A model plug-in's declaration (see the module docstring)."""

    name: str
    build: ImplementedIn
    inputs: str = "image"
    offers: frozenset[str] = frozenset(MODEL_OFFERS)

    def __post_init__(self) -> None:
        if self.inputs not in MODEL_INPUTS:
            raise DeclarationError(f"{self.name}: inputs = {self.inputs!r}; allowed: {', '.join(MODEL_INPUTS)}")
        unknown = sorted(set(self.offers) - set(MODEL_OFFERS))
        if unknown:
            raise DeclarationError(f"{self.name}: offers {unknown}; allowed: a set of {', '.join(MODEL_OFFERS)}")

    def __call__(self, num_classes: int, input_shape: tuple[int, ...]) -> Any:
        return self.build(num_classes, tuple(input_shape))


@dataclass(frozen=True)
class BrokenModel:
    """A model plug-in that cannot be used, and why."""

    name: str
    module: str
    distribution: str
    problem: str

    def line(self) -> str:
        return (f"model plug-in {self.name!r} (distribution {self.distribution}, module {self.module}) cannot be used: "
                f"{self.problem}")


def _declaration(name: str, module_name: str) -> ModelSpec:
    declarations = getattr(import_plugin_module(module_name), "MODELS", ())
    if not all(isinstance(d, ModelSpec) for d in declarations):
        raise ValueError("MODELS holds something other than a ModelSpec")
    named = [d for d in declarations if d.name == name]
    if not named:
        declared = ", ".join(repr(d.name) for d in declarations) or "nothing (no MODELS)"
        raise ValueError(f"its module declares no model named {name!r} (it declares {declared})")
    return named[0]


def load_model_plugins(
    entry_points: Iterable[tuple[str, str, str]] | None = None,
) -> tuple[dict[str, ModelSpec], dict[str, BrokenModel]]:
    """The model plug-ins (those installed, or ``entry_points``: (name, module, distribution)),
    usable and broken, by name."""
    if entry_points is None:
        entry_points = [(e.name, e.value, e.dist.name if e.dist is not None else "an unknown distribution")
                        for e in metadata.entry_points(group=ENTRY_POINT_GROUP)]
    models: dict[str, ModelSpec] = {}
    broken: dict[str, BrokenModel] = {}
    first_of: dict[str, tuple[str, str]] = {}  # name → the (module, distribution) that declared it first
    for name, module, distribution in sorted(entry_points):
        if name in first_of:  # neither is used; the line keeps the first one's own problem, if it had one
            first_module, first_distribution = first_of[name]
            own = f"; that one's own problem: {broken[name].problem}" if name in broken else ""
            models.pop(name, None)
            broken[name] = BrokenModel(name, module, distribution,
                                       f"its name is also the model plug-in of module {first_module} (distribution "
                                       f"{first_distribution}){own}")
            continue
        first_of[name] = (module, distribution)
        try:
            if name in MODEL_NAMES or name == "auto":
                raise ValueError("its name is one of Basin's own models")
            models[name] = _declaration(name, module)
        except Exception as error:
            broken[name] = BrokenModel(name, module, distribution, str(error))
    return models, broken


MODEL_PLUGINS, BROKEN_MODELS = load_model_plugins()
