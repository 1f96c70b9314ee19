"""Tables and figures of finished runs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd


def summary_table(summaries: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per run label: last-k, best and final accuracy, round reaching target, rounds
    (run and skipped), failed client replies over the run, time."""
    rows = []
    for label, s in summaries.items():
        k = s.get("last-k", 10)
        rows.append({
            "run": label,
            "acc last k": s.get(f"last-{k}-accuracy"),
            "k": k,
            "best acc": s.get("best-accuracy"),
            "best round": s.get("best-round"),
            "final acc": s.get("final-accuracy"),
            "round to target": s.get("round-reaching-target"),
            "target": s.get("target-accuracy"),
            "rounds": s.get("rounds"),
            "skipped": s.get("rounds-skipped"),
            "client failures": s.get("client-failures"),
            "seconds": s.get("wall-seconds"),
        })
    return pd.DataFrame(rows).set_index("run")


def plot_accuracy(curves: Mapping[str, pd.DataFrame], path: Path, title: str = "") -> Path:
    """Central test accuracy per round: the reported model solid, and where a run also has
    an averaged model, its base model dashed in the same colour."""
    def draw(ax) -> None:
        for label, frame in curves.items():
            (line,) = ax.plot(frame["round"], frame["test-accuracy"], label=label)
            if "averaged-accuracy" in frame and frame["averaged-accuracy"].notna().any():
                ax.plot(frame["round"], frame["base-accuracy"], linestyle="--", color=line.get_color(),
                        alpha=0.7, label=f"{label} (base model)")

    return save_figure(path, title or "central test accuracy per round", "round", "test accuracy", draw)


def save_figure(path: Path, title: str, xlabel: str, ylabel: str, draw: Callable) -> Path:
    """Shared figure frame: ``draw(ax)`` adds the data; titles, grid, legend, saving here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    draw(ax)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
