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
from strategies.cohort import COHORT
from strategies.methods.method_spec import MethodSpec
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


def objective_server(spec: MethodSpec) -> Callable[[Mapping[str, Any]], ClientObjectiveFedAvg]:
    """The server half of a method that only changes the clients' objective (declared with
    :func:`strategies.methods.objective_method`): :class:`ClientObjectiveFedAvg` sending
    the objective's name and its keys' values (``spec.objective_settings`` resolves them when
    they need more than a copy), with the method's own gradient-norm clip if it has one."""

    def build(config: Mapping[str, Any]) -> ClientObjectiveFedAvg:
        values = spec.objective_settings(config) if spec.objective_settings else {
            key: config[key] for key in spec.objective_keys}
        clip = spec.objective_grad_clip(config) if spec.objective_grad_clip else None
        return ClientObjectiveFedAvg(spec.name, values, grad_clip=clip, **COHORT)

    return build
