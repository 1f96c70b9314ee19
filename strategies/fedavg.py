"""FedAvg (McMahan et al., AISTATS 2017): w^{t+1} = sum_i (n_i / n) w_i^t (METHODS.md, FMA).

Flower's FedAvg (its weighted mean read in place: strategies/weighted_mean.py), with Basin's
seeded cohort sampling and partition-ordered aggregation.
"""

from strategies.cohort import COHORT
from strategies.methods import MethodSpec, TableRow
from strategies.sampling import CohortSampling
from strategies.weighted_mean import InPlaceFedAvg


class FedAvg(CohortSampling, InPlaceFedAvg):
    """Federated averaging over a seeded cohort."""


METHODS = (MethodSpec("fedavg", "FedAvg", lambda config: FedAvg(**COHORT), dp_aggregate="mean",
                      cost_table={"fedavg": {}, "fedavg+crop-flip": {}},
                      table_row=TableRow('FedAvg (McMahan et al. 2017): w ← Σ_i (n_i/n)·w_i',
                                         '—')),)
