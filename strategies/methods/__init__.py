"""The method concept: what a method or averaging rule declares, the registry of every one,
and how a run's strategy is built from them.

- ``method_spec.py``: a method's declaration (:class:`MethodSpec`, :func:`objective_method`,
  :class:`TableRow`, its line in docs/methods.md);
- ``averaging_spec.py``: an averaging rule's declaration (:class:`AveragingSpec`);
- ``registry.py``: Basin's declaring modules and the installed plug-ins' (entry points
  ``basin.methods``), every method and rule by name, and their client halves handed over;
- ``objective_server.py``: the server of a method that only changes the clients'
  objective (FedAvg sending the objective);
- ``strategy_builder.py``: a run's strategy (base method, averaging rule, DP in its order)
  and client schedule, built from the validated run config.

A declaring module, Basin's or a plug-in's, imports its vocabulary from here: ``from
strategies.methods import MethodSpec``. Importing this package loads no registry, no
method and no torch; the registry loads with ``strategies.methods.registry``.
:class:`ImplementedIn` (a client half named where it is defined) lives in
clients/declarations.py because models declare with it too, and clients/ may not import
strategies/.
"""

from clients.declarations import ImplementedIn
from strategies.methods.averaging_spec import AveragingSpec, averaging_start_round
from strategies.methods.method_spec import MethodSpec, TableRow, objective_method

__all__ = ["AveragingSpec", "ImplementedIn", "MethodSpec", "TableRow", "averaging_start_round", "objective_method"]
