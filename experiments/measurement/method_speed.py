"""Client steps per second of every shipped method, and the step mode each takes: the
implementation behind ``.venv/bin/python -m experiments.benchmark --methods [--modes]``.

Each method runs on Basin's own client path (the strategy's real training message, then
``LocalRound`` as the ClientApp builds it; experiments/measurement/method_costs.py) on
synthetic tensors, in two setups: the Fashion-MNIST CNN (1×28×28, no augmentation) and a
CIFAR-shaped ResNet (3×32×32) with crop + flip. Per method: the step mode on this device
and why (clients/client_step.py), client steps per second over one timed round after a
warm-up round (where a graph is captured), and the ratio to FedAvg's steps per second
measured in the same invocation. ``--modes`` measures nothing: for every method, with and
without augmentation, the mode its step would take on a CUDA device, and why.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from flwr.app import ArrayRecord, RecordDict

from clients import protocol
from clients.client_info import ClientInfo
from clients.client_step import WARMUP_STEPS
from clients.local_round import LocalRound
from clients.log import log
from clients.memory_format import in_layout, memory_format
from clients.models import build_model, uses_projection_head
from clients.training import select_device
from experiments.measurement.method_costs import REFERENCE, method_config, training_content
from strategies.methods.registry import METHODS_BY_NAME, hand_over_client_halves


@dataclass(frozen=True)
class Setup:
    model: str
    input_shape: tuple[int, ...]
    batch_size: int
    augment: str  # run config ``augment``

    @property
    def label(self) -> str:
        return f"{self.model} {'x'.join(map(str, self.input_shape))}" + (f" + {self.augment}" if self.augment != "none" else "")


def setups(resnet: str) -> list[Setup]:
    """The FMNIST CNN as the papers run it, and a CIFAR-shaped ResNet with crop + flip."""
    return [Setup("fmnist-cnn", (1, 28, 28), 50, "none"), Setup(resnet, (3, 32, 32), 64, "crop-flip")]


def shipped_methods() -> list[str]:
    """Every method Basin ships, FedAvg first."""
    return [REFERENCE, *(name for name in METHODS_BY_NAME if name != REFERENCE)]


def client_round(method: str, setup: Setup, device: str, overrides: Mapping[str, Any], steps: int
                 ) -> tuple[torch.nn.Module, LocalRound, torch.Tensor, torch.Tensor]:
    """One client of ``method`` in ``setup``: its model (loaded with the sent weights), its
    round, and ``steps`` full batches of synthetic data, all on ``device``."""
    hand_over_client_halves()
    config = method_config(method, setup.model, setup.input_shape, setup.batch_size, device,
                           {**overrides, "augment": setup.augment})
    torch.manual_seed(config["seed"])
    projection_head = uses_projection_head(setup.model, method)
    model = build_model(setup.model, setup.input_shape, 10, projection_head)
    content = training_content(config, ArrayRecord(model.state_dict()))
    layout = memory_format(setup.model, select_device(device).type)
    model = model.to(select_device(device)).to(memory_format=layout)
    data = torch.Generator().manual_seed(config["seed"])
    x = in_layout(torch.randn(steps * setup.batch_size, *setup.input_shape, generator=data).to(next(model.parameters()).device),
                  layout)
    y = torch.randint(10, (len(x),), generator=data).to(x.device)
    round_ = LocalRound(model, content, RecordDict(), np.random.default_rng(config["seed"]), ClientInfo.of(y, 10))
    return model, round_, x, y


def modes_table(methods: list[str], resnet: str, overrides: Mapping[str, Any]) -> pd.DataFrame:
    """Per method and augmentation, the mode its step takes on a CUDA device and why (built on the CPU)."""
    rows = []
    for method in methods:
        for augment in ("none", "crop-flip"):
            setup = Setup(resnet, (3, 32, 32), 8, augment)  # a residual network: every method's objective builds
            _, local_round, _, y = client_round(method, setup, "cpu", overrides, 1)
            mode, why = local_round.step_mode(torch.device("cuda"), len(y))
            rows.append({"method": method, "augment": augment, "mode on CUDA": mode, "why": why or "-"})
    return pd.DataFrame(rows)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def steps_per_second(method: str, setup: Setup, device: str, overrides: Mapping[str, Any], steps: int
                     ) -> dict[str, Any]:
    """One method's row: its mode here and steps/s over one timed round of ``steps`` steps."""
    try:
        model, local_round, x, y = client_round(method, setup, device, overrides, steps)
    except (TypeError, ValueError) as error:  # e.g. FedAlign's slimmable last stage on the CNN
        return {"method": method, "mode": "n/a", "why": str(error).splitlines()[0], "steps/s": float("nan")}
    torch_device = next(model.parameters()).device
    mode, why = local_round.step_mode(torch_device, len(y))
    generator = torch.Generator().manual_seed(0)
    local_round.round_config[protocol.LOCAL_STEPS] = WARMUP_STEPS + 2  # warm-up: cuDNN, capture, first replay
    try:
        local_round.train(model, x, y, generator)
    except (TypeError, ValueError) as error:
        return {"method": method, "mode": "n/a", "why": str(error).splitlines()[0], "steps/s": float("nan")}
    local_round.round_config[protocol.LOCAL_STEPS] = steps
    _synchronize(torch_device)
    started = time.perf_counter()
    local_round.train(model, x, y, generator)  # ends by reading the loss: synchronised
    seconds = time.perf_counter() - started
    return {"method": method, "mode": mode, "why": why or "-", "steps/s": steps / seconds}


def speed_table(methods: list[str], resnet: str, device: str, overrides: Mapping[str, Any], steps: int,
                progress: bool = True) -> pd.DataFrame:
    """Per setup and method: mode, why, steps/s and the ratio to FedAvg's in the same setup."""
    frames = []
    for setup in setups(resnet):
        rows = []
        for method in methods:
            if progress:
                log.getChild("benchmark").info(f"{setup.label}: {method} …")
            rows.append(steps_per_second(method, setup, device, overrides, steps))
        frame = pd.DataFrame(rows)
        frame["× FedAvg"] = frame["steps/s"] / frame.loc[frame["method"] == REFERENCE, "steps/s"].iloc[0]
        frame.insert(0, "setup", setup.label)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def format_modes(table: pd.DataFrame) -> str:
    """One line per row, the reason last and unpadded (it can be long)."""
    lines = [f"{'method':<18} {'augment':<10} {'mode on CUDA':<13} why"]
    lines += [f"{r.method:<18} {r.augment:<10} {r[2]:<13} {r.why}" for r in table.itertuples(index=False)]
    return "\n".join(lines)


def format_speed(table: pd.DataFrame) -> str:
    """One line per row, the reason last and unpadded."""
    lines = [f"{'setup':<32} {'method':<18} {'mode':<6} {'steps/s':>9} {'× FedAvg':>9}  why"]
    for row in table.itertuples(index=False):
        rate = "n/a" if pd.isna(row[4]) else f"{row[4]:,.0f}"
        ratio = "n/a" if pd.isna(row[5]) else f"{row[5]:.2f}"
        lines.append(f"{row.setup:<32} {row.method:<18} {row.mode:<6} {rate:>9} {ratio:>9}  {row.why}")
    return "\n".join(lines)


def methods_command(args, overrides: Mapping[str, Any]) -> int:
    """``--methods [LIST] [--modes]`` (see the module docstring)."""
    methods = shipped_methods() if args.methods == "all" else [REFERENCE, *(
        m for m in dict.fromkeys(m.strip() for m in args.methods.split(",")) if m and m != REFERENCE)]
    unknown = [m for m in methods if m not in METHODS_BY_NAME]
    if unknown:
        from experiments.runtime.cli import UsageError

        raise UsageError(f"--methods: {', '.join(unknown)} not known; allowed: all, or a comma-separated list of "
                         f"{', '.join(METHODS_BY_NAME)}")
    if args.modes:
        print(format_modes(modes_table(methods, args.resnet, overrides)))
        return 0
    device = select_device(args.device or "auto")
    table = speed_table(methods, args.resnet, args.device or "auto", overrides, args.steps)
    print(f"client steps per second, one timed round of {args.steps} steps per method after a warm-up round, on "
          f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else f'the CPU ({torch.get_num_threads()} threads)'}")
    print(format_speed(table))
    if args.out:
        table.to_csv(args.out / "methods.csv", index=False)
        print(f"table: {(args.out / 'methods.csv').resolve()}")
    return 0
