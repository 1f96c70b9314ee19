"""Run-config keys: what each allows, and the error a bad value raises.

The building blocks of the run config: the general keys (strategies/config.py) and every
method's own keys (its :class:`~strategies.methods.MethodSpec`) are :class:`Option` values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A run-config value is missing, of the wrong type, or out of range."""


@dataclass(frozen=True)
class Option:
    """A run-config key: its type, what it allows (in words, for errors and ``--list-keys``),
    the check of a value, and its choices when they are a list (for "did you mean").
    ``default`` is set for a method's own keys, which its declaration owns; the general
    keys' defaults are ``pyproject.toml``'s."""

    kind: type
    allowed: str
    check: Callable[[Any], bool] = lambda _: True
    choices: tuple[str, ...] = ()
    default: Any = None


def one_of(*names: str, default: str | None = None) -> Option:
    """A key whose value is one of ``names``."""
    return Option(str, "one of " + ", ".join(repr(n) for n in names), lambda v: v in names, names, default)
