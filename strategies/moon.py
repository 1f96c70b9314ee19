"""MOON's declaration (Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021,
eqs. 1–3): FedAvg whose clients add the model-contrastive term; the objective is
clients/objectives/moon.py. Named where it is defined (``ImplementedIn``), so the launcher
reads this declaration without importing torch.
"""

from __future__ import annotations

from clients.options import Option
from strategies.methods import ImplementedIn, TableRow, objective_method

METHODS = (
    objective_method(
        "moon", "MOON", ImplementedIn("clients.objectives.moon:moon_objective"), ("moon-mu", "moon-temperature"),
        options={
            "moon-mu": Option(float, "a number >= 0 (MOON's contrastive weight μ)", lambda v: v >= 0, default=1.0),
            "moon-temperature": Option(float, "a number > 0 (MOON's τ)", lambda v: v > 0, default=0.5),
        },
        client_state=True, model_needs="image", projection_head=True, cost_table={"moon": {}},
        smoke_runs={"moon": {"num-rounds": 2}},
        table_row=TableRow('MOON (Li et al. 2021) eqs. 1–3: contrastive term μ = `moon-mu`, τ = '
                           "`moon-temperature`; on ResNet-56 the model gets FedAlign's two-layer projection head "
                           'FC(256,256)–ReLU–FC(256,256)',
                           '—'),
    ),
)
