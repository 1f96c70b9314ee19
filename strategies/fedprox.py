"""FedProx (Li et al., MLSys 2020): each client minimises F_i(w) + (μ/2)‖w − w^t‖².

Server side this is FedAvg that sends μ as ``proximal-mu`` (Flower's FedProx); the
proximal term is added by the client's training loop (clients/training.py).
"""

from flwr.serverapp.strategy import FedProx as FlowerFedProx

from clients.options import Option
from strategies.cohort import COHORT
from strategies.methods import ImplementedIn, MethodSpec, TableRow
from strategies.sampling import CohortSampling
from strategies.weighted_mean import InPlaceFedAvg


class FedProx(CohortSampling, FlowerFedProx, InPlaceFedAvg):
    """FedProx over a seeded cohort."""

    client_half = "the proximal term μ(w − w^t) in every local step"


METHODS = (
    MethodSpec(
        "fedprox", "FedProx", lambda config: FedProx(**COHORT, proximal_mu=config["prox-mu"]),
        options={"prox-mu": Option(float, "a number >= 0 (FedProx proximal weight)", lambda v: v >= 0, default=0.01)},
        client_components=(ImplementedIn("clients.components:proximal"),), dp_aggregate="mean", cost_table={"fedprox": {}},
        smoke_runs={"fedprox+wima": {"num-rounds": 4, "averaging": "wima", "window": 2}},
        table_row=TableRow('FedProx (Li et al. 2020) eq. 2: gradient of (μ/2)‖w − w^t‖², μ = `prox-mu`',
                           '—'),
    ),
)
