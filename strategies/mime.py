"""MIME and MimeLite, server side (Karimireddy et al., NeurIPS 2021, arXiv 2008.03606;
google/fedjax fedjax/algorithms/mime.py and mime_lite.py; RickZack/GHBM @ 41da4a9
src/algo/mime.py L27–46, fed_clients/mime_client.py, center_server/mime_center_server.py,
src/optim/fed_sgd.py L33–74).

The clients imitate a centralized SGD with momentum β whose state m the server keeps, built
only from full-batch gradients at the server model, and frozen on the clients. Round t:

1. **Extra exchange** (:meth:`Mime.prepare_round`): the round's cohort receives θ and
   replies with G_i = ∇f_i(θ) over all of its examples (clients/mime.py); c = avg_i G_i
   (uniform, GHBM's; fedjax weighs by n_i).
2. **Local steps** from y ← θ: Mime g̃ = ∇ℓ(y; ζ) − ∇ℓ(θ; ζ) + c (same batch); MimeLite
   g̃ = ∇ℓ(y; ζ); then y ← y − η_l·(β·m + g̃ + wd·y).
3. **Server**: θ ← θ − η_s·avg_i(θ − y_i) (uniform, GHBM's ``aggregation_policy``);
   m ← β·m + c (PyTorch's heavy ball: m = c after round 1), c the gradient at the old θ.

Defaults (GHBM's configs): β = 0.9 (``mime-momentum``; 0 is the SGD base: MimeLite is
then FedAvg with server lr η_s and needs no exchange), η_s = ``server-lr`` (0 means 0.1;
WIMA's grid {0.1, 1}). ``mime-variant = dampened`` uses d = (1 − β)·g̃ + β·m and
m ← β·m + (1 − β)·c (the paper's momentum may be this EMA; not confirmed), ``lite`` picks
MimeLite. Cost: one full pass over each sampled client's data per round (and a message
round trip), and for Mime a second backward pass per local step. m is checkpointed
state. Replies are summed in partition order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from clients.options import Option, one_of
from clients.protocol import (
    FULL_GRADIENT_ACTION,
    FULL_GRADIENT_RECORD,
    MIME_CORRECTION,
    MIME_DAMPENED,
    MIME_MOMENTUM,
    MIME_STATE,
    OBJECTIVE,
)
from strategies.arrays import counter_mean, is_float, to_numpy, with_record
from strategies.cohort import COHORT
from strategies.exchange import send_and_receive
from strategies.methods import ImplementedIn, MethodSpec, TableRow
from strategies.sampling import ServerUpdate
from strategies.weighted_mean import InPlaceFedAvg


def mime_server_update(
    sent: dict[str, np.ndarray], client_ws: list[dict[str, np.ndarray]], server_lr: float,
    momentum: dict[str, np.ndarray], full_gradient: dict[str, np.ndarray], beta: float, dampened: bool,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(θ⁺, m⁺): θ⁺ = θ − η_s·mean_i(θ − y_i); m⁺ = β·m + c (dampened: β·m + (1 − β)·c).
    Integer buffers take the mean; m covers the trained weights (``full_gradient``'s keys)."""
    new_theta = {}
    for key, value in sent.items():
        if not is_float(value):
            new_theta[key] = counter_mean(client_ws, key, value.dtype)
            continue
        delta = sum(value - cw[key] for cw in client_ws) / len(client_ws)
        new_theta[key] = (value - server_lr * delta).astype(value.dtype)
    weight = 1.0 - beta if dampened else 1.0
    new_momentum = {key: (beta * momentum[key] + weight * c).astype(c.dtype) for key, c in full_gradient.items()}
    return new_theta, new_momentum

MIME_VARIANTS = ("heavy-ball", "dampened")


class Mime(ServerUpdate, InPlaceFedAvg):
    """MIME (``lite=False``) or MimeLite over a seeded cohort; the momentum m is the server state."""

    client_half = "the full-batch gradient exchange and the server's momentum in every local step"

    def __init__(self, lite: bool = False, beta: float = 0.9, server_learning_rate: float = 1.0,
                 variant: str = "heavy-ball", timeout: float = 600.0, **kwargs):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        if variant not in MIME_VARIANTS:
            raise ValueError(f"variant must be one of {MIME_VARIANTS}, got {variant!r}")
        super().__init__(**kwargs)
        self.lite, self.beta, self.server_learning_rate = lite, beta, server_learning_rate
        self.dampened = variant == "dampened"
        self.timeout = timeout
        self.momentum: dict[str, np.ndarray] | None = None
        self.full_gradient: dict[str, np.ndarray] | None = None

    @property
    def needs_full_gradients(self) -> bool:
        """Mime's correction needs c; both need it for m unless the base is plain SGD."""
        return not self.lite or self.beta > 0

    def prepare_round(self, server_round: int, arrays: ArrayRecord, grid) -> None:
        """The round's extra exchange: c = mean of the cohort's full-batch gradients at θ."""
        if not self.needs_full_gradients:
            return
        node_of_partition = self.node_of_partition
        cohort = self.sample_partitions(server_round)  # the cohort configure_train will address
        if not cohort:  # too few available clients: the round is skipped
            return
        messages = [
            Message(content=RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": server_round})}),
                    dst_node_id=node_of_partition[p], message_type=f"query.{FULL_GRADIENT_ACTION}")
            for p in cohort
        ]
        replies = send_and_receive(grid, messages, self.timeout)
        gradients = sorted(
            ((self.partition_of_node[r.metadata.src_node_id], to_numpy(r.content[FULL_GRADIENT_RECORD]))
             for r in replies if not r.has_error()), key=lambda item: item[0],
        )
        if not gradients:
            raise RuntimeError(f"round {server_round}: no client of the cohort returned its full-batch gradient")
        self.full_gradient = {key: np.asarray(sum(g[key] for _, g in gradients) / len(gradients)) for key in gradients[0][1]}

    def configure_train(self, server_round, arrays, config, grid):
        weights = to_numpy(arrays)
        if self.momentum is None:
            self.momentum = {k: np.zeros_like(v) for k, v in weights.items() if is_float(v)}
        config[MIME_MOMENTUM] = self.beta
        config[MIME_DAMPENED] = self.dampened
        if not self.lite:
            config[OBJECTIVE] = "mime"
        messages = with_record(super().configure_train(server_round, arrays, config, grid), MIME_STATE, self.momentum)
        if self.lite:
            return messages
        # c from prepare_round; zeros where no exchange ran (a caller of configure_train alone, e.g. the cost table).
        correction = self.full_gradient or {k: np.zeros_like(v) for k, v in self.momentum.items()}
        return with_record(messages, MIME_CORRECTION, correction)

    def server_update(self, models, metrics, replies):
        gradient = self.full_gradient if self.full_gradient is not None else {k: np.zeros_like(v) for k, v in self.momentum.items()}
        model, self.momentum = mime_server_update(self.sent_weights, models, self.server_learning_rate, self.momentum,
                                                  gradient, self.beta, self.dampened)
        return model

    def state_dict(self) -> dict:
        """The server momentum m (numpy arrays; None before the first round)."""
        return {"momentum": self.momentum}

    def load_state_dict(self, state: dict) -> None:
        self.momentum = state["momentum"]


MIME_OPTIONS = {
    "mime-momentum": Option(float, "a number in [0, 1) (MIME/MimeLite's base optimizer momentum β; 0 = plain SGD)",
                            lambda v: 0 <= v < 1, default=0.9),
    "mime-variant": one_of(*MIME_VARIANTS, default="heavy-ball"),
}


def _mime(name: str, display_name: str, lite: bool, smoke_run: dict[str, Any],
          table_row: TableRow | None = None) -> MethodSpec:
    def build(config):
        return Mime(**COHORT, lite=lite, beta=config["mime-momentum"], server_learning_rate=spec.server_lr(config),
                    variant=config["mime-variant"], timeout=config["round-timeout"])

    spec = MethodSpec(name, display_name, build, options=MIME_OPTIONS,
                      objective=None if lite else ImplementedIn("clients.mime:mime_objective"),
                      client_components=(ImplementedIn("clients.mime:server_momentum"),), plain_sgd=True,
                      reply_records={FULL_GRADIENT_RECORD: "∇f_i(θ), the client's mean gradient over all of its "
                                                           "examples at the received model (the extra exchange)"},
                      default_server_lr=0.1, cost_table={name: {}}, smoke_runs={name: smoke_run},
                      table_row=table_row)
    return spec


METHODS = (_mime("mime", "MIME", lite=False, smoke_run={"server-lr": 1.0, "momentum": 0.0},
                 table_row=TableRow('MIME / MimeLite (Karimireddy et al., NeurIPS 2021; fedjax and GHBM): an '
                                    "extra exchange each round, the cohort's full-batch gradients at θ, c = their"
                                    ' mean; local step y ← y − η_l·(β·m + g̃), MIME g̃ = ∇ℓ(y; ζ) − ∇ℓ(θ; ζ) + c '
                                    '(same batch), MimeLite g̃ = ∇ℓ(y; ζ); m frozen on the clients; server θ ← θ '
                                    '− η_s·mean_i(θ − y_i), m ← β·m + c; β = `mime-momentum` (0.9; 0: SGD base), '
                                    'η_s = `server-lr` (0: 0.1)',
                                    '`mime-variant = heavy-ball` (`dampened`: (1 − β)·g̃ + β·m, m ← β·m + (1 − '
                                    'β)·c). Extra cost per round: a message round trip and one pass over each '
                                    "sampled client's data; MIME a second backward per step")),
           _mime("mimelite", "MimeLite", lite=True, smoke_run={"num-rounds": 2, "momentum": 0.0, "lr": 0.2}))
