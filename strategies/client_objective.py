"""FedAvg whose clients train a named local objective: MOON, FedSAM, FedASAM, FedAlign,
and the FedAlign study's Mixup, Stochastic Depth and GradAug (clients/objectives/).

These methods change only what a client minimises; the server is FedAvg. Like Flower's
FedProx sending ``proximal-mu``, the strategy sends the objective's name and settings in
every round's config, so the client needs nothing but the message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from clients.protocol import OBJECTIVE
from strategies.method import COHORT, MethodSpec
from strategies.sampling import CohortSampling
from strategies.weighted_mean import InPlaceFedAvg


class ClientObjectiveFedAvg(CohortSampling, InPlaceFedAvg):
    """FedAvg over a seeded cohort that names the clients' local objective."""

    client_half = "the local objective it names (MOON, FedSAM, FedAlign, …)"

    def __init__(self, objective: str, settings: Mapping[str, float | int], grad_clip: float | None = None, **kwargs):
        super().__init__(**kwargs)
        self.objective = objective
        self.settings = dict(settings)
        # A method's own gradient-norm clip (FedAlign's 10), sent in place of the run config's.
        self.grad_clip = grad_clip

    def configure_train(self, server_round, arrays, config, grid):
        config[OBJECTIVE] = self.objective
        if self.grad_clip is not None:
            config["grad-clip"] = self.grad_clip
        for key, value in self.settings.items():
            config[key] = value
        return super().configure_train(server_round, arrays, config, grid)


def objective_method(
    name: str, display_name: str, objective: Callable[..., Any], objective_keys: tuple[str, ...] = (),
    settings: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
    grad_clip: Callable[[Mapping[str, Any]], float] | None = None, **declaration: Any,
) -> MethodSpec:
    """The declaration of a method that only changes the clients' objective: the server is
    :class:`ClientObjectiveFedAvg` sending ``objective_keys`` (``settings`` resolves their
    values from the run config when they need more than a copy, ``grad_clip`` a clip of the
    method's own); ``declaration`` holds the other :class:`MethodSpec` fields."""

    def build(config: Mapping[str, Any]) -> ClientObjectiveFedAvg:
        values = settings(config) if settings else {key: config[key] for key in objective_keys}
        return ClientObjectiveFedAvg(name, values, grad_clip=grad_clip(config) if grad_clip else None, **COHORT)

    return MethodSpec(name, display_name, build, objective=objective, objective_keys=objective_keys, **declaration)
