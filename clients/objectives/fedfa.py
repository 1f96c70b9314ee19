"""FedFA, client side (Zhou, Zhang, Tsang, "FedFA: Federated Learning with Feature Anchors to
Align Features and Classifiers for Heterogeneous Data", IEEE TMC 2023, arXiv 2211.09299; the
authors' code TailinZhou/FedFA @ e4aa421 utils/AnchorLoss.py L38–55, utils/optimizer.py
``fedfa_cl_optimizer`` L376–490; strategies/fedfa.py has the server).

The model must expose its features h (``model.represent``) and a linear classifier
(``model.classifier``: logits = W·h + b), as every Basin model does. The anchors A (C × d,
one per class, frozen for the round) come from the server. Per local step:

1. h, logits of the batch; loss CE + L_A with L_A = λ·(1/C)·Σ_j ‖h_j − a_{y_j}‖²/n_{y_j}
   (n_c: the batch's samples of class c; divided by C, not by the classes present);
2. the SGD step on it (with the run's momentum and weight decay);
3. calibration (:meth:`FeatureAnchors.after_step`): one Adam step (PyTorch's defaults, a
   fresh Adam each round) on (W, b) alone with CE(W·A + b, [0, …, C − 1]), all C anchors,
   detached;
4. s_c += the batch's mean h of class c (the features of step 1, before the update).

At each epoch's end (:meth:`FeatureAnchors.end_epoch`), for each class c seen in the epoch:
m_c = s_c/(batches in the epoch) (all batches, as the code: rare classes shrink), and
ā_c ← ρ·ā_c + (1 − ρ)·m_c; ā starts as A. The client sends ā. IMA's variant turns the
anchor loss and the calibration off per round (strategies/fedfa.py).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from clients.protocol import FEDFA_ANCHOR_LOSS, FEDFA_ANCHORS, FEDFA_CALIBRATE
from clients.training import LocalObjective


class FeatureAnchors(LocalObjective):
    """FedFA's local objective, calibration and anchor EMA for one round.

    Steps 1–4 (the module docstring) run inside the local step, so it is captured as a CUDA graph: the class counts
    and sums are formed with ``index_add_`` and ``torch.where`` (no boolean-mask indexing,
    whose result size the host would have to read), the batch count is a device tensor, and
    on CUDA the calibration's Adam is ``capturable``. The anchors, the sums and Adam's state
    are the step's round state (``LocalObjective.adopt``): a fresh Adam each round is the
    first round's Adam with its state zeroed.
    """

    capturable = True
    round_state = ("anchors", "class_sums", "seen", "epoch_batches", "calibration")

    def __init__(self, model: nn.Module, anchors: torch.Tensor, lam: float, rho: float, anchor_loss: bool = True,
                 calibrate: bool = True):
        if not hasattr(model, "represent") or not isinstance(getattr(model, "classifier", None), nn.Linear):
            raise ValueError(f"FedFA needs a model with features (represent) and a linear classifier; "
                             f"{type(model).__name__} has not")
        device = next(model.parameters()).device
        self.anchors = anchors.to(device)
        self.updated_anchors = self.anchors.clone()
        self.num_classes = self.anchors.shape[0]
        self.lam, self.rho, self.anchor_loss = lam, rho, anchor_loss
        # capturable: Adam's step count and bias corrections on the device (CUDA only; the CPU has no graphs).
        self.calibration = (torch.optim.Adam(model.classifier.parameters(), capturable=device.type == "cuda")
                            if calibrate else None)
        self.class_sums = torch.zeros_like(self.anchors)
        self.seen = torch.zeros(self.num_classes, dtype=torch.bool, device=device)
        self.epoch_batches = torch.zeros((), device=device)

    def signature(self) -> tuple:
        return (self.lam, self.rho, self.anchor_loss, self.calibration is not None)

    def backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        features = model.represent(x)
        loss = F.cross_entropy(model.classifier(features), y)
        counts = torch.zeros(self.num_classes, dtype=features.dtype, device=y.device).index_add_(
            0, y, torch.ones_like(y, dtype=features.dtype))
        if self.anchor_loss:
            distances = ((features - self.anchors[y]) ** 2).sum(dim=1) / counts[y]
            loss = loss + self.lam * distances.sum() / self.num_classes
        loss.backward()
        with torch.no_grad():
            sums = torch.zeros_like(self.class_sums).index_add_(0, y, features.detach())
            present = counts > 0
            self.class_sums += torch.where(present[:, None], sums / counts.clamp_min(1)[:, None], 0.0)
            self.seen |= present
            self.epoch_batches += 1
        return loss.detach()

    def after_step(self, model: nn.Module) -> None:
        """Calibrate the classifier on the anchors: one Adam step on CE(W·A + b, classes)."""
        if self.calibration is None:
            return
        self.calibration.zero_grad(set_to_none=True)
        classes = torch.arange(self.num_classes, device=self.anchors.device)
        F.cross_entropy(model.classifier(self.anchors), classes).backward()
        self.calibration.step()

    @torch.no_grad()
    def end_epoch(self) -> None:
        """ā_c ← ρ·ā_c + (1 − ρ)·s_c/(batches), for the classes seen this epoch."""
        means = self.class_sums / self.epoch_batches.clamp_min(1)  # no class is seen in an epoch without batches
        moved = self.rho * self.updated_anchors + (1 - self.rho) * means
        self.updated_anchors = torch.where(self.seen[:, None], moved, self.updated_anchors)
        self.class_sums.zero_()
        self.seen.zero_()
        self.epoch_batches.zero_()

    def reply_tensors(self) -> dict[str, torch.Tensor]:
        return {"anchors": self.updated_anchors.cpu()}


def fedfa_objective(settings, model: nn.Module, state, rng, records) -> FeatureAnchors:
    """The anchors come beside the model; the IMA schedule switches parts per round."""
    return FeatureAnchors(
        model, records[FEDFA_ANCHORS].to_torch_state_dict()["anchors"], float(settings["fedfa-lambda"]),
        float(settings["fedfa-rho"]),
        anchor_loss=bool(settings[FEDFA_ANCHOR_LOSS]), calibrate=bool(settings[FEDFA_CALIBRATE]),
    )
