"""A reproduction's report files: report.md (the cells, the headline, the notes),
report.csv, and report.png (Basin against the paper, each cell with its own tolerance,
and for with/without pairs the gains); the table the command line prints."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from clients.atomic_files import write_atomically
from experiments.reproduction.table_cells import COST_METRICS, NOT_THE_SETUP, RUN_METRICS, PaperTable
from experiments.reproduction.verdicts import TOLERANCES, Tolerances, headline
from experiments.runtime.machine import data_problem_of


def _format(value: float | None, censored: bool = False, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.0f}+" if censored else f"{value:.{digits}f}"


def basin_text(row: Mapping[str, Any]) -> str:
    """Basin's number of a report row as shown: ``1000+`` when no seed reached the target,
    ``≥ 412 (2 of 3 seeds reached)`` when some did not (the mean is then a lower bound); with the
    simulated clock, rounds to target gain the seeds' mean simulated time to it: ``35 (1,204 s simulated)``."""
    rounds = row["metric"] == "rounds-to-target"
    reached = row.get("basin reached")
    if reached is not None and not pd.isna(reached) and row["basin"] is not None:
        return f"≥ {row['basin']:g} ({int(reached)} of {int(row['seeds'])} seeds reached)"
    text = _format(row["basin"], bool(row["basin censored"]), 0 if rounds else 2)
    seconds = row.get("basin time-to-target")
    if rounds and seconds is not None and not pd.isna(seconds):  # runs on the simulated clock
        text += f" ({seconds:,.0f} s simulated)"
    return text


def setup_lines(table: PaperTable) -> list[str]:
    """What --set changed: the paper's setup (then the runs are not the paper's), or only where
    and how they ran; Markdown bold around the first."""
    setup = {k: v for k, v in table.overrides.items() if k not in NOT_THE_SETUP}
    placement = {k: v for k, v in table.overrides.items() if k in NOT_THE_SETUP}
    lines = []
    if setup:
        changed = ", ".join(f"{k} = {v!r}" for k, v in setup.items())
        lines.append(f"**Not the paper's setup**: every run was changed by --set {changed}.")
    if placement:
        where = ", ".join(f"{k} = {v!r}" for k, v in placement.items())
        lines.append(f"Run with --set {where}: where and how the runs executed, not what they compute.")
    return lines


def verdict_rules() -> str:
    """The rules the verdicts follow (experiments/reproduction/verdicts.py's TOLERANCES), said beside the counts."""
    t = TOLERANCES
    return (f"Verdicts: an accuracy matches within {t.accuracy_points:g} points of a paper value without ±, else within "
            f"max({t.spread_floor_points:g}, {t.spread_factor:g}·√(paper ±² + Basin std²)) points; rounds and "
            f"speed-ups within {100 * t.rounds_relative:g} %, MFLOPs and parameters within {100 * t.cost_relative:g} %; "
            f"a gain matches within {t.gain_points:g} points (else same sign, or opposite sign). Basin's 95 % interval is "
            f"Student-t over its seeds; the paired gain's is over the seeds both variants ran, seed by seed.")


def report_markdown(table: PaperTable, report: pd.DataFrame) -> str:
    lines = [f"# {table.title}: Basin beside the paper", "", table.caption, "",
             f"**{headline(report)}**", "",
             f"Paper's seeds: {table.paper_seeds}. Basin's: the seeds finished per cell (column `seeds`)."]
    for line in setup_lines(table):
        lines += ["", line]
    lines += ["", verdict_rules(), "",
              "| row | column | variant | unit | paper | Basin | Basin − paper | verdict | paper gain | Basin gain | "
              "gain verdict | Basin 95 % CI | paired gain 95 % CI |",
              "| --- | --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | --- | --- | --- |"]
    notes: dict[str, int] = {}
    for _, r in report.iterrows():
        basin = basin_text(r)
        if basin and pd.notna(r["basin std"]):
            basin += f" ± {r['basin std']:.2f}"
        paper = r["paper"]
        if r.get("note"):
            paper += f" [{notes.setdefault(r['note'], len(notes) + 1)}]"
        lines.append(
            f"| {r['row']} | {r['column']} | {r['variant']} | {r['unit']} | {paper} | {basin} | {_format(r['difference'])} | "
            f"{r['verdict']} | {_format(r['paper gain'])} | {_format(r['basin gain'])} | {r['gain verdict']} | "
            f"{r.get('basin 95% CI', '') or ''} | {r.get('paired gain 95% CI', '') or ''} |")
    if notes:
        lines += ["", "Notes:", "", *(f"{number}. {note}" for note, number in notes.items())]
    problems = sorted({data_problem_of(c.config) for c in table.cells if c.config is not None and c.metric in RUN_METRICS}
                      - {None})
    if problems:
        lines += ["", "Data not on this machine:", "", *(f"- {problem}" for problem in problems)]
    return "\n".join(lines) + "\n"


# A figure names its points when it has at most this many per panel (else only those that differ).
LABELLED_POINTS = 40


def plotted(report: pd.DataFrame) -> pd.DataFrame:
    """The cells a report's figure shows: both numbers, neither one a bound."""
    partial = report["basin reached"].notna() if "basin reached" in report else False
    return report[report["basin"].notna() & report["paper value"].notna() & ~report["basin censored"].astype(bool)
                  & ~partial]


def tolerance_bars(points: pd.DataFrame, tolerances: Tolerances = TOLERANCES) -> list[float]:
    """Each point's own tolerance, for its error bar: its accuracy tolerance in points (the
    paper's ± and Basin's seeds widen it), or the relative tolerance times the paper's value."""
    bars = []
    for _, row in points.iterrows():
        if row["metric"] == "acc-last-k":
            bars.append(float(row["tolerance"]) if pd.notna(row["tolerance"]) else tolerances.accuracy_points)
        else:
            relative = tolerances.cost_relative if row["metric"] in COST_METRICS else tolerances.rounds_relative
            bars.append(relative * abs(float(row["paper value"])))
    return bars


def figure_panels(report: pd.DataFrame) -> list[str]:
    """The figure's panels: one per metric with cells to show, then ``gain`` where a pair
    table has cells with both gains."""
    shown = plotted(report)
    panels = list(dict.fromkeys(shown["metric"]))
    if report["paper gain"].notna().any() and report["basin gain"].notna().any() and \
            (report["paper gain"].notna() & report["basin gain"].notna()).any():
        panels.append("gain")
    return panels


def _point_name(row: Mapping[str, Any]) -> str:
    return " / ".join(part for part in (row["row"], row["column"], row["variant"]) if part)


def plot_report(table: PaperTable, report: pd.DataFrame, path: Path, tolerances: Tolerances = TOLERANCES) -> Path | None:
    """Basin against the paper, one point per cell with both numbers, per metric, each with
    its own tolerance as an error bar and named (row / column / variant); for a without/with
    pair table a last panel puts Basin's gain against the paper's (band: ± the gain
    tolerance). Green: match (gain match); red: otherwise."""
    panels = figure_panels(report)
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = plotted(report)
    figure, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5.4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        if panel == "gain":
            points = report[report["paper gain"].notna() & report["basin gain"].notna()]
            x, y = points["paper gain"].astype(float), points["basin gain"].astype(float)
            good = points["gain verdict"].eq("gain match")
            bars = [tolerances.gain_points] * len(points)
            band, unit = f"± {tolerances.gain_points:g} points", "gain, points"
        else:
            points = shown[shown["metric"] == panel]
            x, y = points["paper value"].astype(float), points["basin"].astype(float)
            good = points["verdict"].eq("match")
            bars = tolerance_bars(points, tolerances)
            band, unit = "each cell's tolerance", panel
        low = float(min(x.min(), (y - pd.Series(bars, index=y.index)).min()))
        high = float(max(x.max(), (y + pd.Series(bars, index=y.index)).max()))
        pad = 0.05 * (high - low or 1.0)
        line = [low - pad, high + pad]
        ax.plot(line, line, color="grey", linewidth=1, label="Basin = paper")
        if panel == "gain":
            ax.fill_between(line, [v - tolerances.gain_points for v in line], [v + tolerances.gain_points for v in line],
                            color="tab:green", alpha=0.12, label=f"gain tolerance {band}")
            ax.axhline(0, color="grey", linewidth=0.5)
            ax.axvline(0, color="grey", linewidth=0.5)
        bars = pd.Series(bars, index=points.index)
        for ok, colour, what in ((True, "tab:green", "within"), (False, "tab:red", "outside")):
            chosen = good.to_numpy() == ok
            if chosen.any():
                ax.errorbar(x[chosen], y[chosen], yerr=bars[chosen], fmt="o", color=colour, markersize=4, elinewidth=1,
                            capsize=2, label=f"{what} its tolerance (bar: {band})")
        label_all = len(points) <= LABELLED_POINTS
        for (_, row), px, py, ok in zip(points.iterrows(), x, y, good):
            if label_all or not ok:
                ax.annotate(_point_name(row), (px, py), xytext=(3, 3), textcoords="offset points", fontsize=6)
        ax.set_xlabel(f"paper ({unit})")
        ax.set_ylabel(f"Basin ({unit})")
        ax.set_xlim(line)
        ax.set_ylim(line)
        title = f"gain {table.variants[-1].strip()}" if panel == "gain" else panel
        ax.set_title(f"{table.title}: {title}", fontsize=10)
        ax.legend(fontsize=7, loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=130)
    plt.close(figure)
    return path


def write_report(table: PaperTable, report: pd.DataFrame, out_dir: Path) -> list[Path]:
    """report.md, report.csv and report.png (when any cell has both numbers) in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(out_dir / "report.md", report_markdown(table, report).encode())
    write_atomically(out_dir / "report.csv", report.to_csv(index=False).encode())
    figure = plot_report(table, report, out_dir / "report.png")
    return [out_dir / "report.md", out_dir / "report.csv", *([figure] if figure else [])]


def printed_table(report: pd.DataFrame) -> str:
    shown = pd.DataFrame({
        "cell": [" | ".join(p for p in (r["row"], r["column"], r["variant"]) if p) for _, r in report.iterrows()],
        "unit": report["unit"],
        "paper": report["paper"],
        "Basin": [basin_text(r) for _, r in report.iterrows()],
        "diff": [_format(v) for v in report["difference"]],
        "verdict": [v if len(v) < 60 else v[:57] + "…" for v in report["verdict"]],
        "gain (paper/Basin)": [f"{_format(p)}/{_format(b)} {g}" if g else "" for p, b, g in
                               zip(report["paper gain"], report["basin gain"], report["gain verdict"])],
    })
    return shown.to_string(index=False)
