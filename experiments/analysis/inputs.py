"""The analysis tools' inputs: run directories, their saved models, data and θ-space evaluation.

A run directory is what a Basin run writes (``config.json``, ``results.csv``, and with
``save-models-every`` > 0 the ``models/round-RRRR.pt`` files of strategies/model_store.py).
A sweep folder (``runs/<run>/``) or any folder holding run directories stands for all of them.

θ, as ANALYSIS.md §0 defines it, is the model's trainable parameters flattened in
``model.parameters()`` order; buffers (BatchNorm's running statistics) are not in θ and
stay those of a reference model while θ moves (the FedAlign convention; IMA's and WIMA's
GroupNorm models have none). :class:`ThetaSpace` evaluates many θ at once: one
``torch.func.functional_call`` vmapped over a chunk of models per test batch, so a 21×21
landscape is a few dozen batched passes instead of 441 model loads.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from clients.data import partition_indices
from clients.models import build_run_model
from clients.training import select_device
from experiments.runtime.progress import progress_bar
from experiments.runtime.run_config import default_run_config
from partitions.datasets import load_dataset
from partitions.feasibility import partition_settings
from partitions.tensor_dataset import TensorDataset
from partitions.text import IGNORE_INDEX
from strategies.indicators import trainable_names
from strategies.methods.registry import hand_over_client_halves
from strategies.model_store import load_round_models, saved_rounds

ANALYSIS_DIR = "analysis"
# Grid models per vmapped pass of ThetaSpace.evaluate, by device. On 2 CPU cores one at a
# time is fastest (experiments/analysis/grid_timing.py, FMNIST CNN: chunks of 4 and 16 ran at
# 0.76× and 0.72× the speed of chunks of 1); the CUDA value is not measured yet: measure
# it with the benchmark on your GPU.
MODELS_PER_PASS = {"cpu": 1, "cuda": 32}


@dataclass
class AnalysisRun:
    """One run directory and what the tools read from it."""

    directory: Path
    config: dict[str, Any] = field(repr=False)

    @classmethod
    def open(cls, directory: Path) -> AnalysisRun:
        directory = Path(directory).expanduser().resolve()
        config_file = directory / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"{directory} is not a Basin run directory: it has no config.json")
        # A run written before a key existed took its default (the keys added since are defaults too).
        return cls(directory, {**default_run_config(), **json.loads(config_file.read_text())})

    @property
    def label(self) -> str:
        """The method as the papers name it: strategy, +averaging when there is one."""
        averaging = self.config.get("averaging", "none")
        return self.config["strategy"] + ("" if averaging == "none" else f"+{averaging}")

    @property
    def output_dir(self) -> Path:
        path = self.directory / ANALYSIS_DIR
        path.mkdir(exist_ok=True)
        return path

    @cached_property
    def data(self) -> TensorDataset:
        return load_dataset(self.config["dataset"], self.config["data-dir"], self.config["normalize"])

    def build_model(self) -> nn.Module:
        hand_over_client_halves()
        return build_run_model(self.config, self.data.input_shape, self.data.num_classes)

    def rounds(self) -> list[int]:
        """The rounds with saved models; FileNotFoundError when the run saved none."""
        rounds = saved_rounds(self.directory)
        if not rounds:
            raise FileNotFoundError(
                f"{self.directory} has no saved models (models/round-*.pt): run it with save-models-every > 0"
            )
        return rounds

    def models(self, server_round: int) -> dict[str, Any]:
        return load_round_models(self.directory, server_round)

    def client_indices(self) -> Sequence[np.ndarray]:
        """Every client's training-sample indices (the run's partition)."""
        config = self.config
        return partition_indices(config["dataset"], config["data-dir"], config["normalize"], partition_settings(config))

    def results(self):
        import pandas as pd

        return pd.read_csv(self.directory / "results.csv")


def find_runs(paths: Iterable[Path]) -> list[AnalysisRun]:
    """The run directories ``paths`` name: each a run directory or a folder holding some
    (a sweep's ``runs/``), sorted by path; FileNotFoundError when there are none."""
    runs = []
    for path in map(Path, paths):
        if (path / "config.json").is_file():
            runs.append(AnalysisRun.open(path))
            continue
        found = sorted(p.parent for p in path.glob("**/config.json"))
        if not found:
            raise FileNotFoundError(f"{path}: no Basin run directory (a folder with config.json) in it")
        runs.extend(AnalysisRun.open(p) for p in found)
    return runs


def resolve_round(run: AnalysisRun, requested: int | None) -> int:
    """``requested`` when the run saved it, else (None) its last saved round."""
    rounds = run.rounds()
    if requested is None:
        return rounds[-1]
    if requested not in rounds:
        raise ValueError(f"--round {requested}: {run.directory} saved rounds {', '.join(map(str, rounds))}; allowed: one of them")
    return requested


class ThetaSpace:
    """A model seen as a function of θ (its flattened trainable parameters)."""

    def __init__(
        self, model: nn.Module, device: str | torch.device = "cpu", reference: Mapping[str, Any] | None = None,
        models_per_pass: int | None = None,
    ):
        self.device = torch.device(device)
        self.models_per_pass = models_per_pass or MODELS_PER_PASS.get(self.device.type, 1)
        self.model = model.to(self.device).eval()
        if reference is not None:  # buffers (BN statistics) and frozen parameters of this model
            self.model.load_state_dict({k: torch.as_tensor(v) for k, v in reference.items()})
        self.names = trainable_names(model)
        parameters = dict(model.named_parameters())
        self.shapes = [parameters[n].shape for n in self.names]
        self.sizes = [parameters[n].numel() for n in self.names]
        self.fixed = {**{n: p.detach() for n, p in parameters.items() if n not in self.names},
                      **{n: b for n, b in model.named_buffers()}}

    @property
    def dimension(self) -> int:
        return sum(self.sizes)

    def theta(self, state: Mapping[str, Any]) -> torch.Tensor:
        """θ of a state dict, float32 on the device."""
        return torch.cat([torch.as_tensor(state[n]).reshape(-1) for n in self.names]).to(self.device, torch.float32)

    def unflatten(self, thetas: torch.Tensor) -> dict[str, torch.Tensor]:
        """{name: tensor (B, *shape)} of a (B, d) batch of θ."""
        pieces = thetas.split(self.sizes, dim=1)
        return {n: piece.reshape(len(thetas), *shape) for n, piece, shape in zip(self.names, pieces, self.shapes)}

    def _logits(self, thetas: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """(B, N, classes): every model of the batch on the same inputs."""
        def one(params: dict[str, torch.Tensor]) -> torch.Tensor:
            return torch.func.functional_call(self.model, {**params, **self.fixed}, (x,))

        return torch.func.vmap(one)(self.unflatten(thetas.to(self.device, torch.float32)))

    @torch.no_grad()
    def outputs(self, theta: torch.Tensor, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
        """One model's logits on ``x`` (N, classes), on the CPU."""
        return torch.cat([self._logits(theta[None], x[i : i + batch_size].to(self.device))[0].cpu()
                          for i in range(0, len(x), batch_size)])

    @torch.no_grad()
    def evaluate(
        self, thetas: torch.Tensor, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024, progress: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Mean cross-entropy and top-1 error (%) of each θ (rows of ``thetas``) on (x, y):
        eval mode, no gradients, CE summed then divided by N (FedIMA's global_test);
        ``models_per_pass`` models at a time."""
        x, y = x.to(self.device), y.to(self.device)
        scored_targets = max(int((y != IGNORE_INDEX).sum()), 1)  # a next-character set: every position but padding
        losses, errors = [], []
        chunks = range(0, len(thetas), self.models_per_pass)
        for start in progress_bar(chunks, desc=progress, unit="chunk", disable=progress is None, leave=False):
            chunk = thetas[start : start + self.models_per_pass]
            loss = torch.zeros(len(chunk), dtype=torch.float64, device=self.device)
            wrong = torch.zeros(len(chunk), dtype=torch.float64, device=self.device)
            for i in range(0, len(y), batch_size):
                logits = self._logits(chunk, x[i : i + batch_size])  # (B, N, classes, …positions)
                target = y[i : i + batch_size].expand(len(chunk), *y[i : i + batch_size].shape)  # (B, N, …)
                per_target = F.cross_entropy(logits.flatten(0, 1), target.flatten(0, 1), reduction="none",
                                             ignore_index=IGNORE_INDEX).reshape(target.shape)
                scored = target != IGNORE_INDEX
                loss += per_target.flatten(1).sum(dim=1).double()
                wrong += ((logits.argmax(dim=2) != target) & scored).flatten(1).sum(dim=1).double()
            losses.append((loss / scored_targets).cpu())
            errors.append((100.0 * wrong / scored_targets).cpu())
        return torch.cat(losses).numpy(), torch.cat(errors).numpy()


def theta_space(
    run: AnalysisRun, device: str, reference: Mapping[str, Any] | None = None, models_per_pass: int | None = None,
) -> ThetaSpace:
    """The run's model as a :class:`ThetaSpace` on ``device`` ('auto': CUDA when there is one)."""
    torch.manual_seed(0)
    return ThetaSpace(run.build_model(), select_device(device), reference, models_per_pass)


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def tool_parser(tool: str, doc: str) -> argparse.ArgumentParser:
    """The command line of ``.venv/bin/python -m experiments.analysis TOOL``, described by the module's first paragraph."""
    return argparse.ArgumentParser(prog=f".venv/bin/python -m experiments.analysis {tool}", description=doc.split("\n\n")[0])


def finished(figure, title: str):
    """``figure`` with its title, laid out."""
    figure.suptitle(title)
    figure.tight_layout()
    return figure


def save_figure(figure, path: Path) -> Path:
    figure.savefig(path, dpi=130, bbox_inches="tight")
    pyplot().close(figure)
    print(f"wrote {path}", flush=True)
    return path


def save_table(table, path: Path) -> Path:
    table.to_csv(path, index=False)
    print(f"wrote {path}", flush=True)
    return path
