"""FedFA, server side (Zhou, Zhang, Tsang, IEEE TMC 2023, arXiv 2211.09299; the authors' code
TailinZhou/FedFA @ e4aa421 server_se1.py L491–492, L528–529, utils/aggregator.py L20–49,
utils/AnchorLoss.py L19–34; IMA's FedFA, TailinZhou/FedIMA @ 3eaf289 utils/optimizer.py
L732–845).

The server keeps one feature anchor per class, A ∈ R^{C×d} in the classifier's input space,
sends it beside the model, and averages what the clients send back with the model's
weights: θ ← Σ_i (n_i/n_S)·y_i, A ← Σ_i (n_i/n_S)·A_i (clients lacking a class send its
anchor unchanged). A starts as C distinct rows of I_d chosen at random when C ≤ d, else as
C rows of N(0, I) normalised to unit length (seeded by the run's seed). The clients'
objective, calibration and anchor EMA: clients/objectives/fedfa.py.

Defaults λ = 0.1 (``fedfa-lambda``), ρ = 0.5 (``fedfa-rho``), as the authors' and IMA's
code. **Default schedule** (``fedfa-variant = paper``, the TMC code): anchor loss and
calibration from round 1. **Variant** ``fedfa-ima`` (IMA's tables): round 1 plain
cross-entropy without calibration (anchors still updated), and calibration only in rounds
t > R/4 (R = ``num-rounds``). A is checkpointed state. Anchors are summed in partition order.
"""

from __future__ import annotations

import numpy as np

from clients.options import Option, one_of
from clients.protocol import FEDFA_ANCHOR_LOSS, FEDFA_ANCHORS, FEDFA_CALIBRATE, OBJECTIVE_RECORD
from strategies.arrays import with_record
from strategies.cohort import COHORT
from strategies.methods import ImplementedIn, MethodSpec, TableRow
from strategies.methods.objective_server import ClientObjectiveFedAvg

FEDFA_VARIANTS = ("paper", "fedfa-ima")
CLASSIFIER_WEIGHT = "classifier.weight"  # (C, d): every Basin model's linear head


def initial_anchors(num_classes: int, dim: int, seed: int) -> np.ndarray:
    """C distinct one-hot rows of I_d (C ≤ d), else C unit-length Gaussian rows."""
    rng = np.random.default_rng([seed, 0xFEDFA])
    if num_classes <= dim:
        return np.eye(dim, dtype=np.float32)[rng.choice(dim, size=num_classes, replace=False)]
    rows = rng.standard_normal((num_classes, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def round_schedule(variant: str, server_round: int, num_rounds: int) -> tuple[bool, bool]:
    """(anchor loss on, calibration on) in round ``server_round`` (1-based)."""
    if variant == "paper":
        return True, True
    return server_round > 1, server_round > 1 and server_round > num_rounds / 4


class FedFa(ClientObjectiveFedAvg):
    """FedAvg of models and feature anchors; the anchors are the server state."""

    def __init__(self, lam: float = 0.1, rho: float = 0.5, variant: str = "paper", num_rounds: int = 1, seed: int = 0,
                 **kwargs):
        if variant not in FEDFA_VARIANTS:
            raise ValueError(f"variant must be one of {FEDFA_VARIANTS}, got {variant!r}")
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"rho must be in [0, 1], got {rho}")
        super().__init__("fedfa", {"fedfa-lambda": lam, "fedfa-rho": rho}, **kwargs)
        self.variant, self.num_rounds, self.anchor_seed = variant, num_rounds, seed
        self.anchors: np.ndarray | None = None

    def configure_train(self, server_round, arrays, config, grid):
        if self.anchors is None:
            if CLASSIFIER_WEIGHT not in arrays:
                raise ValueError(f"FedFA needs a model whose linear head is named 'classifier' ({CLASSIFIER_WEIGHT})")
            num_classes, dim = arrays[CLASSIFIER_WEIGHT].shape
            self.anchors = initial_anchors(num_classes, dim, self.anchor_seed)
        config[FEDFA_ANCHOR_LOSS], config[FEDFA_CALIBRATE] = round_schedule(self.variant, server_round, self.num_rounds)
        return with_record(super().configure_train(server_round, arrays, config, grid), FEDFA_ANCHORS,
                           {"anchors": self.anchors})

    def aggregate_accepted(self, server_round, replies):
        anchors = [record["anchors"].numpy() for record in self.declared_records(OBJECTIVE_RECORD)]  # partition order
        weights = [float(next(iter(reply.content.metric_records.values()))["num-examples"]) for reply in replies]
        if anchors:
            total = sum(weights)
            self.anchors = (sum(w * a for w, a in zip(weights, anchors)) / total).astype(np.float32)
        return super().aggregate_accepted(server_round, replies)

    def state_dict(self) -> dict:
        """The feature anchors A (C × d; None before the first round)."""
        return {"anchors": self.anchors}

    def load_state_dict(self, state: dict) -> None:
        self.anchors = state["anchors"]


METHODS = (
    MethodSpec(
        "fedfa", "FedFA",
        lambda config: FedFa(**COHORT, lam=config["fedfa-lambda"], rho=config["fedfa-rho"],
                             variant=config["fedfa-variant"], num_rounds=config["num-rounds"], seed=config["seed"]),
        options={
            "fedfa-lambda": Option(float, "a number >= 0 (FedFA's anchor-loss weight λ)", lambda v: v >= 0, default=0.1),
            "fedfa-rho": Option(float, "a number in [0, 1] (FedFA's anchor EMA ρ: ā ← ρ·ā + (1 − ρ)·class mean)",
                                lambda v: 0 <= v <= 1, default=0.5),
            "fedfa-variant": one_of(*FEDFA_VARIANTS, default="paper"),
        },
        objective=ImplementedIn("clients.objectives.fedfa:fedfa_objective"), objective_keys=("fedfa-lambda", "fedfa-rho"),
        model_needs="image",
        reply_records={OBJECTIVE_RECORD: "its feature anchors: per class, the mean feature of its examples (C × d)"},
        cost_table={"fedfa": {}},
        table_row=TableRow("FedFA (Zhou et al., IEEE TMC 2023; the authors' code): one feature anchor per class A"
                           " (C × d, in the classifier's input space) sent with the model; each step CE + "
                           'λ·(1/C)·Σ_j ‖h_j − a_{y_j}‖²/n_{y_j}, then one Adam step of the classifier alone on '
                           'CE(W·A + b, classes); per epoch ā_c ← ρ·ā_c + (1 − ρ)·(class-mean features); server '
                           'averages models and anchors by n_i; λ = `fedfa-lambda` (0.1), ρ = `fedfa-rho` (0.5). '
                           'Needs a model with features and a linear `classifier`: every Basin model has them',
                           "`fedfa-variant = paper` (`fedfa-ima`: IMA's code, plain CE in round 1 and calibration"
                           ' only after R/4; the IMA sweeps use it)'),
    ),
)
