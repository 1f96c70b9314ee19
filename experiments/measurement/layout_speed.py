"""``experiments.benchmark --layouts``: client steps/s of each convolutional model in each
memory layout (torch's default, contiguous NCHW, and channels-last NHWC) on this machine's
device, and their ratio.

Each model's two layouts are measured in this one process, alternating (contiguous, then
channels-last, ``--repeats`` times), each time a fresh model and batch in that layout,
``--steps`` SGD steps of Basin's local training (batch 50, momentum 0.9, the FMNIST and
CIFAR setups' step) after two untimed ones; the median of each layout's repeats is printed
with the ratio. Ratios, not absolute times, are what carries from one machine to another.
clients/memory_format.py holds the layout each model uses, chosen from these ratios.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from clients.memory_format import CHANNELS_LAST, CONV_MODEL_INPUTS, in_layout, memory_format
from clients.models import build_model
from clients.training import LocalTrainingConfig, select_device, train_local

BATCH_SIZE = 50


def steps_per_second(model_name: str, layout: torch.memory_format, device: torch.device, steps: int) -> float:
    """Client steps/s of ``steps`` local SGD steps of a fresh model in ``layout``."""
    torch.manual_seed(0)
    shape = CONV_MODEL_INPUTS[model_name]
    model = build_model(model_name, shape, 10).to(device).to(memory_format=layout)
    data = torch.Generator().manual_seed(0)
    x = in_layout(torch.randn((steps + 2) * BATCH_SIZE, *shape, generator=data).to(device), layout)
    y = torch.randint(10, (len(x),), generator=data).to(device)
    config = LocalTrainingConfig(lr=0.01, local_epochs=1, batch_size=BATCH_SIZE, momentum=0.9, weight_decay=0.0,
                                 grad_clip=0.0)
    train_local(model, x[:2 * BATCH_SIZE], y[:2 * BATCH_SIZE], config, torch.Generator().manual_seed(0), mode="eager")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    result = train_local(model, x[2 * BATCH_SIZE:], y[2 * BATCH_SIZE:], config, torch.Generator().manual_seed(0),
                         mode="eager")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result.num_steps / (time.perf_counter() - started)


def layouts_command(args: Any) -> int:
    """Print (and with ``--out`` write ``layouts.json``) each model's steps/s per layout and ratio."""
    device = select_device(args.device or "cpu")
    torch.set_num_threads(args.threads)
    models = list(CONV_MODEL_INPUTS) if args.layouts == "all" else args.layouts.split(",")
    unknown = [name for name in models if name not in CONV_MODEL_INPUTS]
    if unknown:
        raise SystemExit(f"--layouts: {', '.join(unknown)} is not allowed; allowed: all or of {', '.join(CONV_MODEL_INPUTS)}")
    print(f"client steps/s on {device} with {args.threads} torch thread(s), batch {BATCH_SIZE}, {args.steps} steps, "
          f"median of {args.repeats} alternations")
    print(f"{'model':14s} {'contiguous':>11s} {'channels-last':>14s} {'ratio':>6s}  used")
    rows = []
    for name in models:
        measured: dict[str, list[float]] = {"contiguous": [], "channels-last": []}
        for _ in range(args.repeats):
            measured["contiguous"].append(steps_per_second(name, torch.contiguous_format, device, args.steps))
            measured["channels-last"].append(steps_per_second(name, CHANNELS_LAST, device, args.steps))
        plain, last = statistics.median(measured["contiguous"]), statistics.median(measured["channels-last"])
        used = "channels-last" if memory_format(name, device.type) == CHANNELS_LAST else "contiguous"
        print(f"{name:14s} {plain:11.2f} {last:14.2f} {last / plain:6.2f}  {used}", flush=True)
        rows.append({"model": name, "device": str(device), "threads": args.threads, **measured,
                     "ratio": last / plain, "used": used})
    if args.out:
        Path(args.out, "layouts.json").write_text(json.dumps(rows, indent=1))
    return 0
