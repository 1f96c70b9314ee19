"""Central evaluation (``evaluation = central``, the default): each round's models scored on
the run's test split, on the server, in the clients' memory layout; with domains (a
feature-skewed set), the reported model's accuracy on each domain's test samples.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord
from flwr.serverapp import Grid

from clients.memory_format import in_layout
from clients.training import evaluate
from strategies.indicators import CKA_SAMPLES
from strategies.results import RunRecorder
from strategies.round_interface import RoundStrategy


class CentralEvaluation:
    """Each round's models scored on the run's test split, on the server (``evaluation = central``)."""

    def __init__(self, data, device: torch.device, layout: torch.memory_format, recorder: RunRecorder):
        self.cka_inputs = data.x_test[:CKA_SAMPLES].to(device)  # the first test samples, in the data set's order
        # In the clients' layout too (clients/memory_format.py): it runs every round.
        x_test, y_test, self.domains = test_split_by_domain(data)
        self.x_test, self.y_test = in_layout(x_test.to(device), layout), y_test.to(device)
        if self.domains:
            recorder.extend_columns(("domain-mean-accuracy", *self.domains))

    def __call__(self, grid: Grid, strategy: RoundStrategy, sent: ArrayRecord, server_round: int,
                 model: torch.nn.Module) -> dict[str, Any]:
        return evaluate_round(strategy, sent, model, self.x_test, self.y_test, self.domains)

    @staticmethod
    def client_rows(strategy: RoundStrategy) -> list[dict[str, Any]]:
        """With client-evaluation: the round's clients' scores of the model they received."""
        return strategy.round_client_evaluation()


def evaluate_round(strategy: RoundStrategy, sent: ArrayRecord, model, x_test, y_test,
                   domains: dict[str, slice] | None = None) -> dict[str, Any]:
    """Central accuracy/loss of the base model and, when there is one, the averaged model;
    with ``domains`` (:func:`test_split_by_domain`), the reported model's accuracy on each domain's
    test samples and their mean.

    The reported model is the averaged one when it exists (IMA: it is also the one sent),
    else the base model.
    """
    def score(arrays: ArrayRecord) -> tuple[float, float]:
        model.load_state_dict(arrays.to_torch_state_dict())
        return evaluate(model, x_test, y_test)

    base, averaged = strategy.round_models(sent)
    base_loss, base_accuracy = score(base)
    row: dict[str, Any] = {"base-accuracy": base_accuracy, "base-loss": base_loss, "sent-model": "base",
           "test-accuracy": base_accuracy, "test-loss": base_loss}
    if averaged is not None:
        averaged_loss, averaged_accuracy = score(averaged)
        row.update({"averaged-accuracy": averaged_accuracy, "averaged-loss": averaged_loss,
                    "test-accuracy": averaged_accuracy, "test-loss": averaged_loss})
        row["sent-model"] = "averaged" if strategy.sends_average else "base"
    if domains:  # the model holds the reported weights (scored last)
        for column, part in domains.items():
            row[column] = evaluate(model, x_test[part], y_test[part])[1]
        row["domain-mean-accuracy"] = sum(row[c] for c in domains) / len(domains)
    return row


def test_split_by_domain(data) -> tuple[torch.Tensor, torch.Tensor, dict[str, slice]]:
    """The test split ordered by domain, and {``accuracy-<domain>`` column: that domain's
    slice of it} ({} without domains): per-domain scores read views, no copies, every round."""
    if data.test_domains is None:
        return data.x_test, data.y_test, {}
    domains = np.asarray(data.test_domains)
    order = torch.from_numpy(np.argsort(domains, kind="stable"))
    ends = np.cumsum(np.bincount(domains))
    names = data.domain_names or tuple(str(d) for d in range(len(ends)))
    slices = {f"accuracy-{name}": slice(int(end - count), int(end))
              for name, end, count in zip(names, ends, np.bincount(domains))}
    return data.x_test[order], data.y_test[order], slices
