"""FedProx (Li et al., MLSys 2020): each client minimises F_i(w) + (μ/2)‖w − w^t‖².

Server side this is FedAvg that sends μ as ``proximal-mu`` (Flower's FedProx); the
proximal term is added by the client's training loop (clients/training.py).
"""

from flwr.serverapp.strategy import FedProx as FlowerFedProx

from strategies.sampling import CohortSampling
from strategies.weighted_mean import InPlaceFedAvg


class FedProx(CohortSampling, FlowerFedProx, InPlaceFedAvg):
    """FedProx over a seeded cohort."""
