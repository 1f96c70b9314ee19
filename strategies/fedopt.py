"""Adaptive server optimizers (Reddi et al., ICLR 2021, Algorithm 2): FedAdam, FedYogi,
FedAdagrad, with Flower's implementations and Basin's seeded cohorts.

Δ_t = w_FMA − w_t; m_t = β1·m_{t−1} + (1 − β1)·Δ_t;
Adam: v_t = β2·v_{t−1} + (1 − β2)·Δ_t²; Yogi: v_t = v_{t−1} − (1 − β2)·Δ_t²·sign(v_{t−1} − Δ_t²);
Adagrad: v_t = v_{t−1} + Δ_t²; w_{t+1} = w_t + η·m_t/(√v_t + τ) (Flower adds Adam's bias
correction). Defaults η = 0.01, β1 = 0.9, β2 = 0.99, τ = 1e-3 (METHODS.md §2.2).
Flower's FedOpt records the arrays it sends in ``configure_train``, so under IMA the
pseudo-gradient is taken against the averaged model the clients received.
"""

from flwr.serverapp.strategy import FedAdagrad as FlowerFedAdagrad
from flwr.serverapp.strategy import FedAdam as FlowerFedAdam
from flwr.serverapp.strategy import FedYogi as FlowerFedYogi

from strategies.sampling import CohortSampling


class FedAdam(CohortSampling, FlowerFedAdam):
    """FedAdam over a seeded cohort."""


class FedYogi(CohortSampling, FlowerFedYogi):
    """FedYogi over a seeded cohort."""


class FedAdagrad(CohortSampling, FlowerFedAdagrad):
    """FedAdagrad over a seeded cohort."""
