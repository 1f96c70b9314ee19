"""MoFedSAM, server side (Qu, Li, Duan, Liu, Tang, Lu, "Generalized Federated Learning via
Sharpness Aware Minimization", ICML 2022; the reimplementation woodenchild95/FL-Simulator
@ 502bec6 client/mofedsam.py L12–36, optimizer/ESAM.py L20–69, server/MoFedSAM.py L27, L33,
identical in MediaBrain-SJTU/FedLESAM @ d6663cc; the paper's normalisation of Δ and the
placement of α are not confirmed).

FedSAM with FedCM's client-level momentum. Each local step (clients/objectives/sam.py with
ESAM's 1e-7 in the norm, then clients/fedcm.py's term):

    g = ∇ℓ(y; ζ);   ε = ρ·g/(‖g‖₂ + 1e-7)          (the plain gradient only: Δ_t not in ε)
    g̃ = ∇ℓ(y + ε; ζ) on the same batch, y restored (both passes update BatchNorm statistics)
    v = α·g̃ + (1 − α)·Δ_t;   y ← y − η_l·(clip₁₀(v) + wd·y)

The server is FedCM's (strategies/fedcm.py), with its per-client Δ_t scaling by default
and the server scaling as ``fedcm-variant = server``. Defaults ρ = 0.1 (``sam-rho`` = 0
means it), α = 0.1 (``fedcm-alpha``), η_g = 1. FedSWA's code hard-codes ρ = 0.1, γ = 0.9
(α = 1 − γ).
"""

from __future__ import annotations

from clients.protocol import OBJECTIVE
from strategies.cohort import COHORT
from strategies.fedcm import FEDCM_OPTIONS, FedCm
from strategies.methods import ImplementedIn, MethodSpec, TableRow
from strategies.sam import SAM_RHO

MOFEDSAM_DEFAULT_RHO = 0.1


class MoFedSam(FedCm):
    """FedCM whose clients take SAM gradients of radius ``rho``."""

    def __init__(self, rho: float = MOFEDSAM_DEFAULT_RHO, **kwargs):
        if rho <= 0:
            raise ValueError(f"rho must be > 0, got {rho}")
        super().__init__(**kwargs)
        self.rho = rho

    def configure_train(self, server_round, arrays, config, grid):
        config[OBJECTIVE] = "mofedsam"
        config["sam-rho"] = self.rho
        return super().configure_train(server_round, arrays, config, grid)


METHODS: tuple[MethodSpec, ...] = (
    MethodSpec(
        "mofedsam", "MoFedSAM",
        lambda config: MoFedSam(**COHORT, rho=config["sam-rho"] or MOFEDSAM_DEFAULT_RHO, alpha=config["fedcm-alpha"],
                                variant=config["fedcm-variant"], server_learning_rate=METHODS[0].server_lr(config)),
        partial_work=lambda config: "planned-steps" if config["fedcm-variant"] == "per-client" else "steps-taken",
        options={**FEDCM_OPTIONS, "sam-rho": SAM_RHO},
        objective=ImplementedIn("clients.objectives.sam:esam_objective"), objective_keys=("sam-rho",),
        client_components=(ImplementedIn("clients.fedcm:momentum_direction"),),
        plain_sgd=True, cost_table={"mofedsam": {}},
        smoke_runs={"mofedsam": {"num-rounds": 2, "grad-clip": 10.0, "momentum": 0.0, "lr": 0.2}},
        table_row=TableRow("MoFedSAM (Qu et al., ICML 2022; the FL-Simulator reimplementation): FedSAM's step (ε "
                           "= ρ·g/(‖g‖ + 1e-7) from the plain gradient, g̃ at y + ε) then FedCM's mix v = α·g̃ + "
                           "(1 − α)·Δ_t, clipped; FedCM's server; ρ = `sam-rho` (0: 0.1), α = `fedcm-alpha`",
                           'as FedCM (`fedcm-variant`)'),
    ),
)
