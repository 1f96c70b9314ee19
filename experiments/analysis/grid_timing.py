"""How long a landscape grid takes: batched θ-space evaluation against the one-model-at-a-time loop.

Times the 21×21 grid of ``landscape`` for a model on N test inputs two ways, on the same
device in the same invocation: :meth:`ThetaSpace.evaluate` (a chunk of grid models per
vmapped pass) and the plain loop (load each grid model's weights, evaluate it) that a
notebook would write; prints both and their ratio. The inputs are random tensors of the
model's input shape (the time does not depend on the pixels)::

    .venv/bin/python -m experiments.analysis.grid_timing --model fmnist-cnn --samples 10000 --models-per-pass 1,8,64 [--device cuda]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import torch

from clients.models import MODEL_NAMES, REQUIRED_INPUT, build_model
from clients.training import evaluate, select_device
from experiments.analysis.inputs import ThetaSpace
from experiments.analysis.landscape import grid_axes, plane_through
from experiments.runtime.cli import guarded


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m experiments.analysis.grid_timing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="fmnist-cnn", choices=MODEL_NAMES)
    parser.add_argument("--input-shape", default="", help="C,H,W for models that take any size (default 3,32,32)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--samples", type=int, default=10000, help="test inputs per grid point (FMNIST: 10000)")
    parser.add_argument("--points", type=int, default=21)
    parser.add_argument("--loop-points", type=int, default=21, help="grid points the loop times (its per-point time is scaled up)")
    parser.add_argument("--models-per-pass", default="1,8,64", help="comma-separated chunk sizes to time")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = parser.parse_args(argv)
    device = select_device(args.device)
    shape = REQUIRED_INPUT.get(args.model) or tuple(int(v) for v in (args.input_shape or "3,32,32").split(","))
    if args.model == "mlp" and not args.input_shape:
        shape = (1, 8, 8)
    torch.manual_seed(0)
    models = [build_model(args.model, shape, args.classes) for _ in range(3)]
    x = torch.randn(args.samples, *shape, device=device)
    y = torch.randint(0, args.classes, (args.samples,), device=device)
    space = ThetaSpace(models[0], device)
    thetas = [space.theta(m.state_dict()) for m in models]
    plane = plane_through(*thetas)
    xs, ys = grid_axes([plane.coordinates(t.double()) for t in thetas], args.points)
    grid = plane.points(xs, ys).float()
    chunk_sizes = [int(v) for v in args.models_per_pass.split(",")]
    batched = {}
    for size in chunk_sizes:
        space.models_per_pass = size
        space.evaluate(grid[:size], x, y, args.batch_size)  # warm-up (kernels, allocator)
        synchronize(device)
        started = time.perf_counter()
        space.evaluate(grid, x, y, args.batch_size)
        synchronize(device)
        batched[size] = time.perf_counter() - started

    shell = build_model(args.model, shape, args.classes).to(device)
    names = space.names
    loop_points = min(args.loop_points, len(grid))
    synchronize(device)
    started = time.perf_counter()
    for theta in grid[:loop_points]:
        state = dict(zip(names, (p.reshape(s) for p, s in zip(theta.split(space.sizes), space.shapes))))
        shell.load_state_dict(state, strict=False)
        evaluate(shell, x, y, args.batch_size)
    synchronize(device)
    loop = (time.perf_counter() - started) / loop_points * len(grid)
    print(f"{args.model}, {len(grid)} grid points × {args.samples} inputs on {device}; "
          f"one model at a time (load, evaluate): {loop:.2f} s (timed on {loop_points} points)", flush=True)
    for size, seconds in batched.items():
        print(f"  ThetaSpace.evaluate, {size} models per pass: {seconds:.2f} s = {loop / seconds:.2f}× the loop's speed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
