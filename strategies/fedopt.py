"""Adaptive server optimizers (Reddi et al., ICLR 2021, Algorithm 2): FedAdam, FedYogi,
FedAdagrad, with Flower's implementations and Basin's seeded cohorts.

Δ_t = w_FMA − w_t; m_t = β1·m_{t−1} + (1 − β1)·Δ_t;
Adam: v_t = β2·v_{t−1} + (1 − β2)·Δ_t²; Yogi: v_t = v_{t−1} − (1 − β2)·Δ_t²·sign(v_{t−1} − Δ_t²);
Adagrad: v_t = v_{t−1} + Δ_t²; w_{t+1} = w_t + η·m_t/(√v_t + τ). Defaults η = 0.01,
β1 = 0.9, β2 = 0.99, τ = 1e-3 (Reddi et al.'s grid; the IMA and WIMA setups).

Flower's FedAdam multiplies η by Adam's bias correction √(1 − β2^(t+1))/(1 − β1^(t+1))
(Kingma & Ba), which Reddi et al.'s Algorithm 2 does not have: in round 1 that is
η·√0.0199/0.19 ≈ 0.74·η, and it tends to η. Basin's FedAdam takes the paper's step by
default; ``bias_correction=True`` (run config ``fedadam-bias-correction = true``) gives
Flower's. FedYogi and FedAdagrad are Flower's, which follow the paper.
Flower's FedOpt records the arrays it sends in ``configure_train``, so under IMA the
pseudo-gradient is taken against the averaged model the clients received.
"""

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.serverapp.strategy import FedAdagrad as FlowerFedAdagrad
from flwr.serverapp.strategy import FedAdam as FlowerFedAdam
from flwr.serverapp.strategy import FedYogi as FlowerFedYogi

from strategies.sampling import CohortSampling
from strategies.weighted_mean import InPlaceFedAvg


class FedAdam(CohortSampling, FlowerFedAdam, InPlaceFedAvg):
    """FedAdam over a seeded cohort: Reddi et al.'s step, or Flower's bias-corrected one."""

    def __init__(self, *args, bias_correction: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.bias_correction = bias_correction

    def aggregate_accepted(self, server_round, replies):
        if self.bias_correction:
            return super().aggregate_accepted(server_round, replies)
        aggregated, metrics = super(FlowerFedAdam, self).aggregate_train(server_round, replies)  # the FMA
        if aggregated is None:
            return aggregated, metrics
        delta_t, m_t, _ = self._compute_deltat_and_mt(aggregated)
        if not self.v_t:
            self.v_t = {k: np.zeros_like(v) for k, v in delta_t.items()}
        self.v_t = {k: self.beta_2 * v + (1 - self.beta_2) * delta_t[k] ** 2 for k, v in self.v_t.items()}
        new_arrays = {
            k: (x + self.eta * m_t[k] / (np.sqrt(self.v_t[k]) + self.tau)).astype(x.dtype)
            for k, x in self.current_arrays.items()
        }
        return ArrayRecord({k: Array(np.asarray(v)) for k, v in new_arrays.items()}), metrics


class FedYogi(CohortSampling, FlowerFedYogi, InPlaceFedAvg):
    """FedYogi over a seeded cohort."""


class FedAdagrad(CohortSampling, FlowerFedAdagrad, InPlaceFedAvg):
    """FedAdagrad over a seeded cohort."""
