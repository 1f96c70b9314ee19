"""FedAvg (McMahan et al., AISTATS 2017): w^{t+1} = sum_i (n_i / n) w_i^t (METHODS.md, FMA).

Flower's FedAvg, with Basin's seeded cohort sampling and partition-ordered aggregation.
"""

from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from strategies.sampling import CohortSampling


class FedAvg(CohortSampling, FlowerFedAvg):
    """Federated averaging over a seeded cohort."""
