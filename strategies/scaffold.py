"""SCAFFOLD, server side (Karimireddy et al., ICML 2020, Algorithm 1; METHODS.md §2.2).

The server sends its control variate c with the model; each client replies with its
model and Δc_i (clients/control_variates.py). Then c ← c + (|S|/N)·mean_{i∈S} Δc_i and the model
is the FMA of the client models (the paper's x ← x + η_g·mean Δy_i with η_g = 1, weighted
by sample counts as every FMA in this project). Δc_i are summed in partition order.
"""

from __future__ import annotations

import numpy as np

from clients.protocol import SCAFFOLD_DELTA_CONTROL, SCAFFOLD_SERVER_CONTROL
from strategies.arrays import to_numpy, with_record
from strategies.cohort import COHORT
from strategies.methods import ImplementedIn, MethodSpec, TableRow
from strategies.sampling import CohortSampling
from strategies.weighted_mean import InPlaceFedAvg


def server_control_update(
    control: dict[str, np.ndarray], deltas: list[dict[str, np.ndarray]], num_clients: int
) -> dict[str, np.ndarray]:
    """c ← c + (|S|/N)·(1/|S|) Σ Δc_i = c + Σ Δc_i / N."""
    return {k: control[k] + sum(d[k] for d in deltas) * (len(deltas) / num_clients) / len(deltas) for k in control}


class Scaffold(CohortSampling, InPlaceFedAvg):
    """SCAFFOLD over a seeded cohort; the control variate ``control`` is checkpointed state."""

    client_half = "each client's control variate c_i and the correction c − c_i"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.control: dict[str, np.ndarray] | None = None

    def configure_train(self, server_round, arrays, config, grid):
        if self.control is None:
            # Controls exist for trainable weights: every array of Basin's models.
            self.control = {k: np.zeros_like(v) for k, v in to_numpy(arrays).items()}
        return with_record(super().configure_train(server_round, arrays, config, grid), SCAFFOLD_SERVER_CONTROL, self.control)

    def aggregate_accepted(self, server_round, replies):
        deltas = [to_numpy(delta) for delta in self.declared_records(SCAFFOLD_DELTA_CONTROL)]
        if deltas:
            self.control = server_control_update(self.control, deltas, len(self.partition_of_node))
        return super().aggregate_accepted(server_round, replies)


METHODS = (
    MethodSpec("scaffold", "SCAFFOLD", lambda config: Scaffold(**COHORT), client_state=True,
               reply_records={SCAFFOLD_DELTA_CONTROL: "Δc_i = c_i⁺ − c_i, the change of the client's control variate"},
               client_components=(ImplementedIn("clients.control_variates:control_variate", (SCAFFOLD_SERVER_CONTROL,)),),
               # End to end, its c_i carried across rounds and a resume: tests/test_checkpoint_resume.py.
               cost_table={"scaffold": {}}, smoke_runs={},
               table_row=TableRow('SCAFFOLD (Karimireddy et al. 2020) Algorithm 1: step g − c_i + c, option II '
                                  'c_i⁺ = c_i − c + (w^t − w_i)/(Kη), server c ← c + (\\|S\\|/N)·mean Δc_i',
                                  'option II (use `momentum = 0`, as the paper)'),
    ),
)
