"""An exponential moving average of the global models — the worked example of an averaging
rule (docs/extending.md).

Polyak–Juditsky averaging in its exponential form, the EMA of model weights that
Tarvainen & Valpola's mean teacher (NeurIPS 2017, eq. 1) keeps of a student: from round
t_s (``avg-start``) on, with w^t the base method's global model,

    w_EMA ← w^{t_s}  at t_s,    w_EMA ← β·w_EMA + (1 − β)·w^t  after,

β = ``ema-decay``. Like WIMA's shadow model it is evaluated, not sent: the clients keep
receiving the base model (``avg-feedback = true`` sends it). It holds one copy of the model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.serverapp.strategy import Strategy

from clients.options import Option
from strategies.averaging import ModelAveraging
from strategies.methods import AveragingSpec, TableRow, averaging_start_round


def ema_update(average: dict[str, np.ndarray], model: dict[str, np.ndarray], decay: float) -> dict[str, np.ndarray]:
    """β·w_EMA + (1 − β)·w, in each array's dtype."""
    return {key: (decay * average[key] + (1 - decay) * model[key]).astype(model[key].dtype) for key in model}


class ExponentialAveraging(ModelAveraging):
    """An EMA of the base strategy's global models from ``start_round`` on (one copy held)."""

    def __init__(self, base: Strategy, decay: float, start_round: int, feedback: bool = False, subset: str = "all"):
        if not 0 <= decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        super().__init__(base, None, start_round, feedback=feedback, subset=subset)
        self.decay = decay

    def _sample(self, model: dict[str, np.ndarray]) -> None:
        # The running average of ModelAveraging holds the EMA instead of the arithmetic mean.
        if self.running_mean is None:
            self.running_mean = {key: value.copy() for key, value in model.items()}
        else:
            self.running_mean = ema_update(self.running_mean, model, self.decay)
        self.num_averaged += 1


def build_ema(base: Strategy, config: Any) -> ExponentialAveraging:
    return ExponentialAveraging(base, config["ema-decay"], averaging_start_round(config),
                                feedback=config["avg-feedback"], subset=config["avg-subset"])


AVERAGINGS = (
    AveragingSpec(
        "ema", "EMA", build_ema, sends_average=lambda config: config["avg-feedback"],
        options={"ema-decay": Option(float, "a number in [0, 1) (the EMA's β: w_EMA ← β·w_EMA + (1 − β)·w)",
                                     lambda v: 0 <= v < 1, default=0.9)},
        smoke_runs={"fedavg+ema": {"averaging": "ema", "avg-start": 2, "ema-decay": 0.5}},
        table_row=TableRow("an exponential moving average of the base models (the mean teacher's EMA, Tarvainen &"
                           ' Valpola 2017, eq. 1): w_EMA ← β·w_EMA + (1 − β)·w from `avg-start`, β = `ema-decay` '
                           '(0.9); the worked example of an averaging rule in [extending.md](extending.md)',
                           'shadow, evaluated (`avg-feedback = true`: sent)'),
    ),
)
