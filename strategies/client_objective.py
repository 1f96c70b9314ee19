"""FedAvg whose clients train a named local objective: MOON, FedSAM, FedASAM, FedAlign,
and the FedAlign study's Mixup, Stochastic Depth and GradAug (clients/objectives/).

These methods change only what a client minimises; the server is FedAvg. Like Flower's
FedProx sending ``proximal-mu``, the strategy sends the objective's name and settings in
every round's config, so the client needs nothing but the message.
"""

from __future__ import annotations

from collections.abc import Mapping

from clients.objectives import OBJECTIVE_SETTINGS
from clients.protocol import OBJECTIVE
from strategies.sampling import CohortSampling
from strategies.weighted_mean import InPlaceFedAvg


class ClientObjectiveFedAvg(CohortSampling, InPlaceFedAvg):
    """FedAvg over a seeded cohort that names the clients' local objective."""

    def __init__(self, objective: str, settings: Mapping[str, float | int], grad_clip: float | None = None, **kwargs):
        if objective not in OBJECTIVE_SETTINGS:
            raise ValueError(f"objective = {objective!r} is not allowed; allowed: {', '.join(OBJECTIVE_SETTINGS)}")
        missing = [key for key in OBJECTIVE_SETTINGS[objective] if key not in settings]
        if missing:
            raise ValueError(f"objective {objective!r} needs settings {', '.join(missing)}")
        super().__init__(**kwargs)
        self.objective = objective
        self.settings = {key: settings[key] for key in OBJECTIVE_SETTINGS[objective]}
        # A method's own gradient-norm clip (FedAlign's 10), sent in place of the run config's.
        self.grad_clip = grad_clip

    def configure_train(self, server_round, arrays, config, grid):
        config[OBJECTIVE] = self.objective
        if self.grad_clip is not None:
            config["grad-clip"] = self.grad_clip
        for key, value in self.settings.items():
            config[key] = value
        return super().configure_train(server_round, arrays, config, grid)
