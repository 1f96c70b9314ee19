"""Loss and error landscape on the plane through three models (IMA §3.2, Figs 1, 8–10).

With u = w2 − w1 and v = (w3 − w1) − (⟨w3 − w1, u⟩/‖u‖²)·u (Gram–Schmidt), the grid point
(x, y) is the model w1 + x·û + y·v̂ with **unit** vectors û = u/‖u‖, v̂ = v/‖v‖ (the
workshop paper prints u/‖u‖², which Garipov et al.'s reference code, plane.py, shows to be
a typo), so coordinates are Euclidean: w1 ↦ (0, 0), w2 ↦ (‖u‖, 0), w3 ↦ (⟨w3 − w1, û⟩, ‖v‖).
Each point is scored on the global test set (mean cross-entropy, top-1 error %).

Grid (IMA leaves it open; plane.py's defaults): 21 points per axis spanning the three
models' coordinates with a margin of 0.2 of their extent on each side — x = α·‖u‖,
y = β·‖v‖, α, β ∈ [−0.2, 1.2] whenever w3 projects between w1 and w2 — so the triangles
and the cross always lie inside the window.

The command draws IMA's Fig 1: three panels of three client models each, drawn at random
(seeded) from the cohorts of an early, a middle and the last round with saved client
models, and a fourth through the base (FMA) models of the last three saved rounds; loss
on the top row, error on the bottom row; models as black triangles, their unweighted mean
as a white cross::

    .venv/bin/python -m experiments.analysis landscape RUN_DIR [--points 21] [--stages 2,10,30]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from experiments.analysis.inputs import (
    AnalysisRun,
    ThetaSpace,
    finished,
    pyplot,
    save_figure,
    save_table,
    theta_space,
    tool_parser,
)
from experiments.runtime.progress import progress_bar

# Relative margin around the models' coordinates (plane.py: α, β ∈ [−0.2, 1.2]).
MARGIN = 0.2
# Below this ‖v‖/‖u‖ the three models are taken to lie on one line.
COLLINEAR_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Plane:
    """The plane through w1, w2, w3: origin w1 and orthonormal directions û, v̂."""

    origin: torch.Tensor
    u_hat: torch.Tensor
    v_hat: torch.Tensor

    def coordinates(self, theta: torch.Tensor) -> tuple[float, float]:
        """(⟨θ − w1, û⟩, ⟨θ − w1, v̂⟩): the point of the plane nearest θ."""
        offset = theta - self.origin
        return float(offset @ self.u_hat), float(offset @ self.v_hat)

    def points(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        """θ of the grid points, (len(xs)·len(ys), d), row-major in y then x."""
        grid_y, grid_x = torch.meshgrid(ys.to(self.origin), xs.to(self.origin), indexing="ij")
        return self.origin + grid_x.reshape(-1, 1) * self.u_hat + grid_y.reshape(-1, 1) * self.v_hat


def plane_through(w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> Plane:
    """The plane through three models (θ vectors); ValueError when they lie on one line."""
    w1, w2, w3 = (w.to(torch.float64) for w in (w1, w2, w3))
    u = w2 - w1
    u_norm = torch.linalg.vector_norm(u)
    if u_norm == 0:
        raise ValueError("the first two models are identical: they span no plane")
    u_hat = u / u_norm
    offset = w3 - w1
    v = offset - (offset @ u_hat) * u_hat
    v_norm = torch.linalg.vector_norm(v)
    if v_norm <= COLLINEAR_TOLERANCE * u_norm:
        raise ValueError("the three models lie on one line (w3 − w1 is parallel to w2 − w1): they span no plane")
    return Plane(w1, u_hat, v / v_norm)


def grid_axes(coordinates: Sequence[tuple[float, float]], points: int, margin: float = MARGIN) -> tuple[torch.Tensor, torch.Tensor]:
    """x and y values of a ``points`` × ``points`` grid around the models' coordinates."""
    xy = np.asarray(coordinates, dtype=np.float64)
    low, high = xy.min(axis=0), xy.max(axis=0)
    extent = high - low
    low, high = low - margin * extent, high + margin * extent
    return (torch.linspace(float(low[0]), float(high[0]), points, dtype=torch.float64),
            torch.linspace(float(low[1]), float(high[1]), points, dtype=torch.float64))


def evaluate_plane(
    score: Callable[[torch.Tensor], dict[str, np.ndarray]], plane: Plane, xs: torch.Tensor, ys: torch.Tensor,
    rows_per_call: int = 1,
) -> dict[str, np.ndarray]:
    """``score`` ((B, d) θ → {name: (B,) values}) on every grid point: {name: (len(ys), len(xs))}."""
    values: dict[str, list[np.ndarray]] = {}
    for start in progress_bar(range(0, len(ys), rows_per_call), desc="grid rows", unit="row", leave=False):
        scored = score(plane.points(xs, ys[start : start + rows_per_call]))
        for name, value in scored.items():
            values.setdefault(name, []).append(np.asarray(value))
    return {name: np.concatenate(parts).reshape(len(ys), len(xs)) for name, parts in values.items()}


def model_scorer(space: ThetaSpace, x: torch.Tensor, y: torch.Tensor, batch_size: int):
    """A ``score`` for :func:`evaluate_plane`: test loss and error of each θ."""
    def score(thetas: torch.Tensor) -> dict[str, np.ndarray]:
        loss, error = space.evaluate(thetas, x, y, batch_size)
        return {"loss": loss, "error": error}

    return score


def landscape(
    space: ThetaSpace, thetas: Sequence[torch.Tensor], x: torch.Tensor, y: torch.Tensor, points: int = 21,
    batch_size: int = 1024,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The grid (x, y, loss, error) and the three models and their mean with their
    coordinates and scores (model, x, y, loss, error) on the plane through three θ."""
    plane = plane_through(*thetas)
    coordinates = [plane.coordinates(theta.to(torch.float64)) for theta in thetas]
    xs, ys = grid_axes(coordinates, points)
    rows_per_call = max(1, space.models_per_pass // points)
    values = evaluate_plane(model_scorer(space, x, y, batch_size), plane, xs, ys, rows_per_call)
    grid_y, grid_x = np.meshgrid(ys.numpy(), xs.numpy(), indexing="ij")
    grid = pd.DataFrame({"x": grid_x.ravel(), "y": grid_y.ravel(), **{k: v.ravel() for k, v in values.items()}})
    mean = np.mean(coordinates, axis=0)
    marks = pd.DataFrame(
        [(f"w{i + 1}", cx, cy) for i, (cx, cy) in enumerate(coordinates)] + [("mean", mean[0], mean[1])],
        columns=["model", "x", "y"],
    )
    models = torch.stack([*thetas, torch.stack(list(thetas)).mean(dim=0)])
    marks["loss"], marks["error"] = space.evaluate(models, x, y, batch_size)
    return grid, marks


def plot_panels(panels: Sequence[tuple[str, pd.DataFrame, pd.DataFrame]], title: str):
    """IMA Fig 1's layout: one column per panel, loss on top, error below."""
    figure, axes = pyplot().subplots(2, len(panels), figsize=(4.2 * len(panels), 7.4), squeeze=False)
    for column, (name, grid, marks) in enumerate(panels):
        xs, ys = np.unique(grid["x"]), np.unique(grid["y"])
        for row, (value, label) in enumerate((("loss", "test loss"), ("error", "test error (%)"))):
            ax = axes[row, column]
            z = grid[value].to_numpy().reshape(len(ys), len(xs))
            filled = ax.contourf(xs, ys, z, levels=20, cmap="viridis")
            ax.contour(xs, ys, z, levels=20, colors="k", linewidths=0.3, alpha=0.4)
            figure.colorbar(filled, ax=ax, shrink=0.85, label=label)
            models = marks[marks["model"] != "mean"]
            ax.scatter(models["x"], models["y"], marker="^", s=70, c="black", zorder=3)
            mean = marks[marks["model"] == "mean"]
            ax.scatter(mean["x"], mean["y"], marker="x", s=80, c="white", linewidths=2.5, zorder=4)
            ax.set_title(f"{name}: {label}", fontsize=10)
            ax.set(xlabel="along w2 − w1", ylabel="along w3, orthogonalised")
    return finished(figure, title)


def client_stages(run: AnalysisRun, requested: Sequence[int] | None) -> list[int]:
    """Three saved rounds with ≥ 3 client models: the requested ones, or the first, the
    one nearest the midway round and the last such round."""
    with_clients = [r for r in run.rounds() if len(run.models(r)["clients"]) >= 3]
    if requested:
        missing = [r for r in requested if r not in with_clients]
        if missing:
            raise ValueError(f"--stages {','.join(map(str, requested))}: rounds {missing} have no 3 saved client models "
                             f"(those that do: {with_clients or 'none'}); allowed: three of them")
        return list(requested)
    if len(with_clients) < 3:
        raise ValueError(f"{run.directory} has {len(with_clients)} saved rounds with >= 3 client models, 3 are needed: "
                         "run with save-models-every > 0, save-client-models >= 3 and >= 3 clients per round")
    first, last = with_clients[0], with_clients[-1]
    middle = min(with_clients[1:-1], key=lambda r: abs(r - (first + last) / 2))
    return [first, middle, last]


def three_rounds(text: str) -> list[int]:
    """``--stages``: three comma-separated round numbers."""
    try:
        rounds = [int(v) for v in text.split(",")]
    except ValueError:
        rounds = []
    if len(rounds) != 3 or min(rounds) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: three comma-separated saved rounds, e.g. 10,20,30")
    return rounds


def main(argv: Sequence[str] | None = None) -> int:
    parser = tool_parser("landscape", __doc__)
    parser.add_argument("run", help="a run directory with saved models")
    parser.add_argument("--points", type=int, default=21, help="grid points per axis (default 21)")
    parser.add_argument("--stages", type=three_rounds, default=None,
                        help="three saved rounds for the client-model panels (default: first, middle, last)")
    parser.add_argument("--seed", type=int, default=0, help="which three client models a panel draws")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--models-per-pass", type=int, default=None,
                        help="grid points evaluated in one vmapped pass (default: 1 on CPU, 32 on CUDA)")
    args = parser.parse_args(argv)
    if args.points < 3:
        raise ValueError(f"--points {args.points}: allowed: an integer >= 3")
    run = AnalysisRun.open(args.run)
    rng = np.random.default_rng(args.seed)
    sets = []
    for stage in client_stages(run, args.stages):
        clients = run.models(stage)["clients"]
        chosen = sorted(rng.choice(sorted(clients), size=3, replace=False).tolist())
        sets.append((f"round {stage}, clients {', '.join(map(str, chosen))}", [clients[c] for c in chosen]))
    last = run.rounds()[-3:]
    if len(last) < 3:
        raise ValueError(f"{run.directory} saved {len(last)} rounds; the global-model panel needs 3 (save-models-last >= 3)")
    sets.append((f"global models of rounds {', '.join(map(str, last))}", [run.models(r)["base"] for r in last]))

    data = run.data
    panels, tables = [], []
    for name, states in progress_bar(sets, desc="landscape panels", unit="panel"):
        space = theta_space(run, args.device, states[0], args.models_per_pass)
        grid, marks = landscape(space, [space.theta(s) for s in states], data.x_test, data.y_test, args.points, args.batch_size)
        panels.append((name, grid, marks))
        tables.append(pd.concat([grid.assign(panel=name, model="grid"), marks.assign(panel=name)], ignore_index=True))
    out = run.output_dir
    save_table(pd.concat(tables, ignore_index=True)[["panel", "model", "x", "y", "loss", "error"]], out / "landscape.csv")
    save_figure(plot_panels(panels, f"{run.label} on {run.config['dataset']}: loss (top) and error (bottom), global test set"),
                out / "landscape.png")
    return 0
