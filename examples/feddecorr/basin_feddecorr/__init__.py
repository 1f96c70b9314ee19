"""FedDecorr as a Basin plug-in: its declaration.

Shi, Liang, Zhang, Tan, Bai, "Towards Understanding and Mitigating Dimensional Collapse
in Heterogeneous Federated Learning", ICLR 2023, eq. 5, as the authors' code computes it
(github.com/bytedance/FedDecorr, ``FedDecorrLoss``): each client minimises

    CE(F(x), y) + β · L_decorr(z),    L_decorr(z) = mean_{i ≠ j} (Ẑᵀ Ẑ)_{ij}² / N

where z (N × d) is the batch's representation (the classifier's input), Ẑ is z standardised
per dimension over the batch (mean 0, unbiased variance 1, ε = 1e-8 under the root) and
the mean runs over the d(d − 1) off-diagonal entries; β = ``feddecorr-beta`` (0.1, the
authors' default). The server is FedAvg sending β each round; like every method, it
composes with Basin's averaging rules (``--set averaging=ima``).

Installed with its entry point (pyproject.toml: ``[project.entry-points."basin.methods"]``,
``feddecorr = "basin_feddecorr"``), Basin finds it: ``--set strategy=feddecorr``. This module
is the declaration and imports no torch (Basin's launcher reads it before Flower starts,
without torch); the objective, which needs torch, is named by where it lives
(``ImplementedIn``) and imported by the clients: basin_feddecorr/objective.py.
"""

from clients.options import Option
from strategies.methods import ImplementedIn, objective_method

METHODS = (
    objective_method(
        "feddecorr", "FedDecorr", ImplementedIn("basin_feddecorr.objective:feddecorr_objective"), ("feddecorr-beta",),
        options={"feddecorr-beta": Option(float, "a number >= 0 (FedDecorr's weight β of the decorrelation term)",
                                          lambda v: v >= 0, default=0.1)},
        model_needs="image", smoke_runs={"feddecorr": {"num-rounds": 2}},
    ),
)
