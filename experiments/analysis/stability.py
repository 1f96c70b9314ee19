"""Learning-curve stability with and without window averaging (WIMA Figs 1–3).

WIMA shows that averaging smooths the accuracy curve; the paper judges it by eye and
defines no number. Per curve Basin reports the paper's result (the mean accuracy of the
last ``--last`` rounds, 100 in WIMA) and a metric of its own, marked as such: the
**round-to-round noise**, the standard deviation of the accuracy differences a_t − a_{t−1}
over a trailing window of ``--window`` rounds, averaged over the last rounds.

Curves: every run's reported accuracy (``test-accuracy``), dashed when the run averages;
for a run whose average is a shadow model (WIMA, server SWA: ``sent-model`` stays
``base``), the base method's own curve in the same run (``base-accuracy``) is that method
without averaging, drawn solid (once: a run of that method with the same seed is the same
curve). Runs that differ only in their seed are summarised together (mean ± std over seeds)::

    .venv/bin/python -m experiments.analysis stability RUN_OR_SWEEP_DIR... [--last 100] [--window 10]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.analysis.inputs import AnalysisRun, find_runs, finished, pyplot, save_figure, save_table, tool_parser
from experiments.runtime.output_dir import create_output_dir


def round_to_round_noise(accuracy: Sequence[float], window: int) -> np.ndarray:
    """Per round, the std of the last ``window`` round-to-round differences (NaN before
    ``window`` differences exist)."""
    differences = pd.Series(np.asarray(accuracy, dtype=np.float64)).diff()
    return differences.rolling(window, min_periods=window).std(ddof=0).to_numpy()


def curve_summary(accuracy: Sequence[float], last: int, window: int) -> dict[str, float]:
    """The last-``last`` mean and std of the accuracy and the mean noise over those rounds."""
    accuracy = np.asarray(accuracy, dtype=np.float64)
    tail = accuracy[-last:]
    noise = round_to_round_noise(accuracy, window)[-last:]
    return {"last-mean": float(tail.mean()), "last-std": float(tail.std()),
            "noise": float(np.nanmean(noise)) if np.isfinite(noise).any() else float("nan")}


def curves_of(run: AnalysisRun) -> list[dict[str, object]]:
    """The run's curves: label, whether averaged, rounds, accuracy."""
    results = run.results()
    averaging = run.config.get("averaging", "none")
    curves = [{"label": run.label, "averaged": averaging != "none", "rounds": results["round"].to_numpy(),
               "accuracy": results["test-accuracy"].to_numpy()}]
    shadow = averaging != "none" and (results["sent-model"] == "base").all()
    if shadow:
        # Its own entry and colour: the base model of a WIMA run is the FedAvg run of the same
        # seed, bit for bit, and would hide under (or hide) that run's curve.
        curves.append({"label": f"{run.label}: base model", "averaged": False, "rounds": results["round"].to_numpy(),
                       "accuracy": results["base-accuracy"].to_numpy()})
    return curves


def plot_stability(curves: list[dict[str, object]], window: int, title: str):
    figure, (top, bottom) = pyplot().subplots(2, 1, figsize=(9, 7), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    colours: dict[str, str] = {}
    for index, curve in enumerate(curves):
        colour = colours.setdefault(str(curve["label"]), f"C{len(colours) % 10}")
        style = "--" if curve["averaged"] else "-"
        label = f"{curve['label']} (seed {curve['seed']})" if curve.get("many-seeds") else str(curve["label"])
        # Each later curve thinner: identical curves (a WIMA run's base model and the run
        # without averaging) stay visible as a line inside a line.
        width = max(0.6, 2.4 - 0.4 * index)
        top.plot(curve["rounds"], 100 * np.asarray(curve["accuracy"]), style, color=colour, label=label, linewidth=width)
        bottom.plot(curve["rounds"], 100 * round_to_round_noise(curve["accuracy"], window), style, color=colour,
                    linewidth=width)
    top.set(ylabel="test accuracy (%)", title="solid: without averaging, dashed: with")
    bottom.set(xlabel="round", ylabel=f"noise (pp), window {window}")
    top.legend(fontsize=8)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return finished(figure, title)


def main(argv: Sequence[str] | None = None) -> int:
    parser = tool_parser("stability", __doc__)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories or sweep folders")
    parser.add_argument("--last", type=int, default=100, help="rounds of the final mean (WIMA: 100)")
    parser.add_argument("--window", type=int, default=10, help="trailing window of the round-to-round noise")
    parser.add_argument("--out", type=Path, default=None, help="folder for the figure and table (default: the first run's analysis/)")
    args = parser.parse_args(argv)
    if args.out is not None:  # a bad folder is named before any model is read
        args.out = create_output_dir(args.out, "--out")
    if args.last < 1 or args.window < 1:
        raise ValueError(f"--last {args.last}, --window {args.window}: allowed: integers >= 1")
    runs = find_runs(args.runs)
    curves, rows = [], []
    seeds_per_label: dict[str, set[int]] = {}
    seen: set[tuple[str, int]] = set()
    for run in runs:
        for curve in curves_of(run):
            curve["seed"] = run.config["seed"]
            if (str(curve["label"]), curve["seed"]) in seen:  # a shadow run's base = the run without averaging
                continue
            seen.add((str(curve["label"]), curve["seed"]))
            seeds_per_label.setdefault(str(curve["label"]), set()).add(run.config["seed"])
            curves.append(curve)
            rows.append({"run": run.directory.name, "curve": curve["label"], "seed": curve["seed"],
                         "averaged": curve["averaged"], **curve_summary(curve["accuracy"], args.last, args.window)})
    for curve in curves:
        curve["many-seeds"] = len(seeds_per_label[str(curve["label"])]) > 1
    table = pd.DataFrame(rows)
    grouped = table.groupby(["curve", "averaged"], sort=False)[["last-mean", "noise"]].agg(["mean", "std", "count"])
    out = args.out or runs[0].output_dir
    save_table(table, out / "stability.csv")
    save_figure(plot_stability(curves, args.window, f"{runs[0].config['dataset']}: learning curves"), out / "stability.png")
    print(grouped.to_string(), flush=True)
    return 0
