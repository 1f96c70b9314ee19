"""FedLC as a Basin plug-in: its declaration (torch-free, so Basin's launcher validates a run
against it without importing torch); the objective is in basin_fedlc/objective.py.

Zhang, Li, Li, Xu, Wu, Ding, Wu, "Federated Learning with Label Distribution Skew via
Logits Calibration", ICML 2022, eq. 8: each client k minimises the cross-entropy of its
calibrated logits, f_y(x) − τ·n_{k,y}^{−1/4}, where n_{k,y} is how many of its training
examples have label y; τ = ``fedlc-tau`` (1.0). The server is FedAvg sending τ each round.
"""

from clients.options import Option
from strategies.methods import ImplementedIn, objective_method

METHODS = (
    objective_method(
        "fedlc", "FedLC", ImplementedIn("basin_fedlc.objective:fedlc_objective"), ("fedlc-tau",),
        options={"fedlc-tau": Option(float, "a number >= 0 (FedLC's calibration strength τ)", lambda v: v >= 0,
                                     default=1.0)},
        smoke_runs={"fedlc": {"num-rounds": 2}},
    ),
)
