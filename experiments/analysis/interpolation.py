"""1-D linear interpolation between two models (Goodfellow et al.; IMA Figs 5(b), 5(c), 7(c)).

w(α) = (1 − α)·w_a + α·w_b on θ, each point scored on the global test set (mean
cross-entropy and top-1 error %). α runs beyond [0, 1] so that the walls on both sides
show (IMA does not state its range: Basin's default α ∈ [−0.5, 1.5], 41 points); α = 0
and α = 1 are marked.

Models are named ``base`` (the base method's global model: under IMA the FMA model before
the window average, FedIMA's ``global_model_beforeIMA``), ``averaged`` (the window
average) or ``client:P`` (partition P's model), each optionally ``@R`` for saved round R
(default: the last saved round). The default pair, base → averaged, is IMA's Fig 7(c) (FMA
vs IMA); ``base@150`` → ``base@300`` is Fig 5(b). Given a sweep, the command draws one
curve per run that has both models — every base method of the sweep::

    .venv/bin/python -m experiments.analysis interpolate RUN_OR_SWEEP_DIR... [--a base] [--b averaged]
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from experiments.analysis.inputs import (
    AnalysisRun,
    ThetaSpace,
    find_runs,
    finished,
    pyplot,
    save_figure,
    save_table,
    theta_space,
    tool_parser,
)
from experiments.runtime.output_dir import create_output_dir


def interpolation_thetas(theta_a: torch.Tensor, theta_b: torch.Tensor, alphas: Sequence[float]) -> torch.Tensor:
    """(len(alphas), d): (1 − α)·θ_a + α·θ_b for each α."""
    alphas = torch.as_tensor(alphas, dtype=theta_a.dtype).reshape(-1, 1)
    return (1 - alphas) * theta_a + alphas * theta_b


def interpolation_curve(
    space: ThetaSpace, theta_a: torch.Tensor, theta_b: torch.Tensor, alphas: Sequence[float],
    x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024,
) -> pd.DataFrame:
    """Test loss and error along the line (columns alpha, loss, error)."""
    loss, error = space.evaluate(interpolation_thetas(theta_a, theta_b, alphas), x, y, batch_size)
    return pd.DataFrame({"alpha": np.asarray(alphas, dtype=np.float64), "loss": loss, "error": error})


def pick_model(run: AnalysisRun, spec: str) -> tuple[str, Mapping[str, Any]] | None:
    """The state dict ``spec`` names (``base``, ``averaged`` or ``client:P``, with ``@R``),
    with its full name; None when that round has no such model (a run without averaging)."""
    name, _, at = spec.partition("@")
    server_round = int(at) if at else run.rounds()[-1]
    if server_round not in run.rounds():
        raise ValueError(f"model {spec!r}: {run.directory} saved rounds {run.rounds()}; allowed: one of them after '@'")
    saved = run.models(server_round)
    if name.startswith("client:"):
        model = saved["clients"].get(int(name.removeprefix("client:")))
    else:
        model = saved[name]
    return (f"{name}@{server_round}", model) if model is not None else None


def parse_model_spec(text: str) -> str:
    """An argparse type: ``base``, ``averaged`` or ``client:P``, optionally ``@R``."""
    name, _, at = text.partition("@")
    client = name.startswith("client:") and name.removeprefix("client:").isdigit()
    if not (name in ("base", "averaged") or client) or (at and not at.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: base, averaged or client:P, optionally @ROUND")
    return text


def plot_curves(curves: pd.DataFrame, a: str, b: str, title: str):
    """Loss (left) and error (right) against α, one curve per run, α = 0 and 1 marked."""
    figure, axes = pyplot().subplots(1, 2, figsize=(11, 4.2))
    for label, curve in curves.groupby("run", sort=False):
        for ax, value in zip(axes, ("loss", "error")):
            ax.plot(curve["alpha"], curve[value], label=label)
    for ax, ylabel in zip(axes, ("test loss", "test error (%)")):
        for alpha, text in ((0.0, a), (1.0, b)):
            ax.axvline(alpha, color="grey", linestyle=":", linewidth=1)
            ax.annotate(f"α={alpha:g}: {text}", (alpha, 1), xycoords=("data", "axes fraction"), rotation=90,
                        va="top", ha="right", fontsize=8, color="grey")
        ax.set_xlabel("α  (w = (1 − α)·a + α·b)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    return finished(figure, title)


def main(argv: Sequence[str] | None = None) -> int:
    parser = tool_parser("interpolate", __doc__)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories or sweep folders with saved models")
    parser.add_argument("--a", type=parse_model_spec, default="base", help="the model at α = 0 (default: base)")
    parser.add_argument("--b", type=parse_model_spec, default="averaged", help="the model at α = 1 (default: averaged)")
    parser.add_argument("--alphas", default="-0.5,1.5,41", help="START,STOP,POINTS, written --alphas=-1,2,61 (default -0.5,1.5,41)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the figure and table (default: the first run's analysis/)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--batch-size", type=int, default=1024)
    args = parser.parse_args(argv)
    if args.out is not None:  # a bad folder is named before any model is read
        args.out = create_output_dir(args.out, "--out")
    try:
        start, stop, points = args.alphas.split(",")
        alphas = np.linspace(float(start), float(stop), int(points))
    except ValueError:
        alphas = np.empty(0)
    if len(alphas) < 2 or not np.isfinite(alphas).all():
        raise ValueError(f"--alphas {args.alphas!r} is not allowed; allowed: START,STOP,POINTS with POINTS >= 2, "
                         "such as -0.5,1.5,41")
    runs = find_runs(args.runs)
    curves, skipped = [], []
    for run in runs:
        a, b = pick_model(run, args.a), pick_model(run, args.b)
        if a is None or b is None:
            skipped.append(run.directory.name)
            continue
        space = theta_space(run, args.device, reference=a[1])
        data = run.data
        curve = interpolation_curve(space, space.theta(a[1]), space.theta(b[1]), alphas, data.x_test, data.y_test,
                                    args.batch_size)
        label = run.label if len(runs) == 1 else f"{run.label} ({run.directory.name})"
        curves.append(curve.assign(run=label, a=a[0], b=b[0]))
    if skipped:
        print(f"skipped (no {args.a} or {args.b} model saved): {', '.join(skipped)}", flush=True)
    if not curves:
        raise ValueError(f"no run has both a {args.a!r} and a {args.b!r} model; runs without averaging have no 'averaged'")
    table = pd.concat(curves, ignore_index=True)
    out = args.out or runs[0].output_dir
    save_table(table[["run", "a", "b", "alpha", "loss", "error"]], out / "interpolation.csv")
    dataset = runs[0].config["dataset"]
    save_figure(plot_curves(table, args.a, args.b, f"{dataset}: linear interpolation from {args.a} (α=0) to {args.b} (α=1)"),
                out / "interpolation.png")
    return 0
