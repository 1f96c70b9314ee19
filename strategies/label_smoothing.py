"""Label smoothing's declaration (Szegedy et al., "Rethinking the Inception Architecture
for Computer Vision", CVPR 2016, §7): FedAvg whose clients minimise cross-entropy against
smoothed targets (clients/objectives/label_smoothing.py).
"""

from __future__ import annotations

from clients.options import Option
from strategies.methods import ImplementedIn, TableRow, objective_method

METHODS = (
    objective_method(
        "label-smoothing", "FedAvg+LS", ImplementedIn("clients.objectives.label_smoothing:label_smoothing_objective"),
        ("label-smoothing",),
        options={"label-smoothing": Option(float, "a number in [0, 1) (label smoothing's ε)", lambda v: 0 <= v < 1,
                                           default=0.1)},
        table_row=TableRow('FedAvg whose clients minimise cross-entropy against smoothed targets (1 − ε)·[k = y] '
                           '+ ε/C (Szegedy et al., CVPR 2016, §7), ε = `label-smoothing` (0.1); the worked '
                           'example of a client objective in [extending.md](extending.md)',
                           '—'),
    ),
)
