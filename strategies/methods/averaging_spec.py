"""An averaging rule's declaration (:class:`AveragingSpec`) and the round its averages start.
A method's declaration (:class:`~strategies.methods.MethodSpec`) is in method_spec.py beside it,
the vocabulary both halves of a method share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clients.options import Option
from strategies.methods.method_spec import TableRow, refuse_options_without_default
from strategies.schedules import ClientSchedule


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
    other keys, the first round whose reported model is an average (figures mark it), the
    clients' schedule under it, and its smoke runs. Rules live in strategies/averaging.py
    (IMA, WIMA, SWA) and their own modules (strategies/ema.py), listed in
    strategies/methods/registry.py's ``AVERAGING_MODULES``, or in a plug-in (docs/extending.md)."""

    name: str
    display_name: str
    build: Callable[[Any, Mapping[str, Any]], Any]
    options: Mapping[str, Option] = field(default_factory=dict)
    check: Callable[[Mapping[str, Any]], None] | None = None
    first_average: Callable[[Mapping[str, Any]], int] = averaging_start_round
    # Whether the clients receive its average (IMA; WIMA and EMA with avg-feedback): then
    # every model it reports is one it sent, which server-side DP outside it needs
    # (strategies/privacy.py). False: a shadow average, evaluated and kept, never sent.
    sends_average: Callable[[Mapping[str, Any]], bool] = lambda config: False
    # The clients' schedule under this rule: (validated config, the base method's schedule)
    # → the schedule the clients get (IMA's exploration, SWA's cyclic lr); None: unchanged.
    client_schedule: Callable[[Mapping[str, Any], ClientSchedule], ClientSchedule] | None = None
    # Its end-to-end smoke runs (tests/test_end_to_end.py): name → run-config overrides of
    # the suite's small setting; the smallest that still exercise the rule's code.
    smoke_runs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    table_row: TableRow | None = None  # its line in docs/methods.md (None: the line of the rule before it)

    def __post_init__(self) -> None:
        refuse_options_without_default(self.name, self.options)
