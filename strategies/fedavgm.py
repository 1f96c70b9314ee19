"""FedAvgM (Hsu et al. 2019): server momentum on the pseudo-gradient.

Δ^t = w^t − w_FMA^{t+1}; v ← β·v + Δ^t; w^{t+1} = w^t − η·v (METHODS.md, server-optimizer
form; β = 0.9, η = 1).

Differs from Flower's FedAvgM in one place: Flower keeps its own copy of the current
model and ignores the arrays it is asked to send. Under IMA the clients receive the
averaged model, so the pseudo-gradient must be taken against that (METHODS.md §1.1):
the copy is refreshed from the arrays sent each round.
"""

from flwr.serverapp.strategy import FedAvgM as FlowerFedAvgM

from clients.options import Option
from strategies.cohort import COHORT
from strategies.methods import MethodSpec, TableRow
from strategies.sampling import CohortSampling
from strategies.weighted_mean import InPlaceFedAvg


class FedAvgM(CohortSampling, FlowerFedAvgM, InPlaceFedAvg):
    """Server momentum over a seeded cohort, anchored to the model clients received."""

    def configure_train(self, server_round, arrays, config, grid):
        self.current_arrays = arrays
        return super().configure_train(server_round, arrays, config, grid)


SERVER_MOMENTUM = Option(float, "a number in [0, 1) (FedAvgM's beta; FedOpt's beta_1)", lambda v: 0 <= v < 1, default=0.9)

METHODS: tuple[MethodSpec, ...] = (
    MethodSpec(
        "fedavgm", "FedAvgM",
        lambda config: FedAvgM(**COHORT, server_learning_rate=METHODS[0].server_lr(config),
                               server_momentum=config["server-momentum"]),
        options={"server-momentum": SERVER_MOMENTUM}, dp_aggregate="step-on-mean", smoke_runs={"fedavgm": {"num-rounds": 2}},
        table_row=TableRow('FedAvgM (Hsu et al. 2019): server momentum on the pseudo-gradient, β = '
                           '`server-momentum`, η = `server-lr` (default 1)',
                           '—'),
    ),
)
