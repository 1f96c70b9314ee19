"""Basin's numbers beside a paper's: each cell's measured value over its seeds, its verdict
against the tolerances (docs/reproducing.md), and the with/without gains.

An accuracy within 3 points of the paper's (with the paper's ±: within twice the root of
the summed squared ± of the paper and of Basin's seeds, at least 1 point) is a ``match``;
rounds within 15 % (both never reaching the target: a match; some seeds missing it: a lower
bound, never a match), a speed-up within 15 %, costs within 5 %. A without/with pair's
"with" cell also gets a gain verdict: ``gain match`` (same sign, within 1.5 points),
``same sign`` or ``opposite sign``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from experiments.reproduction.table_cells import (
    COST_METRICS,
    METRIC_UNITS,
    NOT_THE_SETUP,
    RUN_METRICS,
    Cell,
    PaperTable,
    cell_status,
)
from experiments.seed_intervals import paired_interval, seed_interval

# ---- comparing ------------------------------------------------------------------------

@dataclass(frozen=True)
class Tolerances:
    """When Basin's number counts as the paper's (docs/reproducing.md)."""

    accuracy_points: float = 3.0  # paper without ±
    spread_factor: float = 2.0  # paper with ±: within factor × √(paper ±² + Basin std²) …
    spread_floor_points: float = 1.0  # … but never tighter than this
    gain_points: float = 1.5  # with/without pairs: |Basin's gain − the paper's|
    rounds_relative: float = 0.15  # rounds-to-target and speed-ups
    cost_relative: float = 0.05  # MFLOPs and parameters

    def accuracy(self, paper_spread: float | None, basin_std: float) -> float:
        if paper_spread is None:
            return self.accuracy_points
        return max(self.spread_floor_points, self.spread_factor * math.hypot(paper_spread, basin_std or 0.0))


TOLERANCES = Tolerances()


@dataclass
class Measured:
    """Basin's number for one cell."""

    value: float | None = None
    std: float = 0.0
    seeds: int = 0  # seeds finished
    censored: bool = False  # rounds-to-target: no seed reached the target
    note: str = ""  # why there is no value yet
    reached: int | None = None  # rounds-to-target where some seeds missed: how many reached (value: a lower bound)
    per_seed: dict[int, float] = field(default_factory=dict)  # accuracy (%) by seed: the intervals' values
    # rounds-to-target with the simulated clock (system-speeds): the seeds' mean simulated seconds to the target
    time_to_target: float | None = None


def _run_rows(results: pd.DataFrame, run_ids: list[str]) -> pd.DataFrame:
    return results[results["run"].isin(run_ids) & results["status"].eq("completed")]


def measure_cell(cell: Cell, results: pd.DataFrame, runs_of: Mapping[str, list[str]]) -> Measured:
    """Basin's accuracy (%) or rounds for a run cell, over its finished seeds."""
    ids = runs_of.get(cell.key, [])
    done = _run_rows(results, ids)
    failed = results[results["run"].isin(ids) & results["status"].eq("failed")]
    if done.empty:
        stopped = results[results["run"].isin(ids) & results["status"].eq("pending") & results["error"].ne("")]
        note = (f"failed: {failed['error'].iloc[0]}" if not failed.empty else
                str(stopped["error"].iloc[0]) if not stopped.empty else "not run yet")
        return Measured(note=note)
    if cell.metric == "acc-last-k":
        values = done["acc-last-k"].astype(float).dropna() * 100
        if values.empty:
            return Measured(note="its runs' summaries hold no accuracy")
        seed_of = {run: seed for seed, run in enumerate(ids)}  # a cell's runs are its seeds 0, 1, … in order
        per_seed = {seed_of[run]: float(value) * 100 for run, value in zip(done["run"], done["acc-last-k"].astype(float))
                    if not math.isnan(value)}
        return Measured(float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0, len(values),
                        per_seed=per_seed)
    rounds = done["rounds-to-target"].astype(float)
    reached = rounds.dropna()
    if reached.empty:
        return Measured(float(done["rounds"].max()), 0.0, len(done), censored=True)
    if len(reached) < len(rounds):
        # A seed that missed would have needed more rounds than it ran: the mean over every
        # seed, each missed one counted at its last round, is a lower bound, not a value.
        bound = rounds.fillna(done["rounds"].astype(float)).mean()
        return Measured(float(bound), 0.0, len(done), reached=len(reached))
    seconds = done["time-to-target"].astype(float) if "time-to-target" in done else pd.Series(dtype=float)
    return Measured(float(reached.mean()), float(reached.std(ddof=1)) if len(reached) > 1 else 0.0, len(done),
                    time_to_target=float(seconds.mean()) if len(seconds) and seconds.notna().all() else None)


def verdict(cell: Cell, basin: Measured, tolerances: Tolerances = TOLERANCES) -> tuple[str, float | None]:
    """(verdict, tolerance) of a cell with a Basin value."""
    paper = cell.paper
    if basin.value is None or paper.value is None:
        return "", None
    if cell.metric == "acc-last-k":
        tolerance = tolerances.accuracy(paper.spread, basin.std)
        return ("match" if abs(basin.value - paper.value) <= tolerance else "differs"), tolerance
    if cell.metric == "rounds-to-target":
        if paper.censored or basin.censored:
            return ("match" if paper.censored and basin.censored else "differs"), None
        if basin.reached is not None:  # some seeds missed: only "too many rounds" can be told
            too_many = basin.value - paper.value > tolerances.rounds_relative * abs(paper.value)
            return ("differs" if too_many else f"open: {basin.reached} of {basin.seeds} seeds reached the target"), \
                tolerances.rounds_relative
    relative = tolerances.cost_relative if cell.metric in COST_METRICS else tolerances.rounds_relative
    close = abs(basin.value - paper.value) <= relative * abs(paper.value)
    return ("match" if close else "differs"), relative


def gain_verdict(paper_gain: float, basin_gain: float, tolerances: Tolerances = TOLERANCES) -> str:
    if paper_gain * basin_gain < 0 or (paper_gain == 0) != (basin_gain == 0):
        return "opposite sign"
    return "gain match" if abs(basin_gain - paper_gain) <= tolerances.gain_points else "same sign"


def compare(table: PaperTable, results: pd.DataFrame, runs_of: Mapping[str, list[str]],
            costs: Mapping[str, float] | None = None, tolerances: Tolerances = TOLERANCES) -> pd.DataFrame:
    """One row per cell: the paper's value, Basin's, the difference, the verdict, and for
    the accuracy cells of a without/with pair the gains; cells not run say why."""
    costs = costs or {}
    measured: dict[str, Measured] = {}
    for cell in table.cells:
        if cell.paper.missing or cell.reason:
            continue
        if cell.metric in ("acc-last-k", "rounds-to-target"):
            measured[cell.key] = measure_cell(cell, results, runs_of)
        elif cell.metric in COST_METRICS:
            value = costs.get(cell.key)
            measured[cell.key] = Measured(value, 0.0, 1) if value is not None else Measured(note="not measured yet")
    for cell in table.cells:  # speed-ups: from the rounds of this column and the reference column
        if cell.metric != "speed-up" or cell.config is None:
            continue
        own = next((measured.get(c.key) for c in table.cells if c.row == cell.row and c.column == cell.column
                    and c.metric == "rounds-to-target"), None)
        reference = next((measured.get(c.key) for c in table.cells if c.row == cell.row
                          and c.column == cell.reference_column and c.metric == "rounds-to-target"), None)
        if own and reference and own.value is not None and reference.value is not None:
            if own.censored or reference.censored or own.reached is not None or reference.reached is not None:
                measured[cell.key] = Measured(note="a run never reached the target")
            else:
                measured[cell.key] = Measured(reference.value / own.value, 0.0, min(own.seeds, reference.seeds))
        else:
            measured[cell.key] = Measured(note="its rounds are not measured yet")

    rows = []
    for cell in table.cells:
        basin = measured.get(cell.key, Measured())
        outcome, tolerance = verdict(cell, basin, tolerances)
        if not outcome:
            outcome = (f"not reported: {cell.paper.missing}" if cell.paper.missing else
                       f"unsupported: {cell.reason}" if cell.reason else
                       f"needs data: {cell.config['dataset']} is not on this machine"
                       if cell_status(cell) == "needs data" and basin.note == "not run yet" else
                       basin.note if basin.note.startswith("interrupted") else f"not run: {basin.note}")
        row = {
            "row": cell.row, "column": cell.column, "variant": cell.variant, "metric": cell.metric,
            "unit": METRIC_UNITS[cell.metric],
            "paper": cell.paper.text, "paper value": cell.paper.value, "paper ±": cell.paper.spread,
            "basin": basin.value, "seeds": basin.seeds,
            "basin std": basin.std if basin.seeds > 1 and not basin.censored and basin.reached is None else None,
            "basin censored": basin.censored, "basin reached": basin.reached,
            "difference": (basin.value - cell.paper.value) if basin.value is not None and cell.paper.value is not None
            and not basin.censored and not cell.paper.censored and basin.reached is None else None,
            "basin time-to-target": basin.time_to_target,
            "tolerance": tolerance, "verdict": outcome, "paper gain": None, "basin gain": None, "gain verdict": "",
            "note": cell.note,
        }
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame["basin 95% CI"] = [_interval_text(measured.get(cell.key, Measured()), cell.paper.value) for cell in table.cells]
    frame["paired gain 95% CI"] = ""
    if table.pair and len(table.variants) == 2:
        _add_gains(frame, table.variants, tolerances)
        _add_paired_gain_intervals(frame, table, measured)
    return _one_row_per_configuration(frame, table, runs_of)


def _interval_text(basin: Measured, paper: float | None) -> str:
    """Basin's 95 % interval over seeds (experiments/seed_intervals.py) and whether it covers the
    paper's value; "" with fewer than two seeds."""
    if len(basin.per_seed) < 2:
        return ""
    interval = seed_interval(basin.per_seed.values())
    text = f"[{interval.low:.2f}, {interval.high:.2f}]"
    if paper is None:
        return text
    return f"{text} {'covers' if interval.covers(paper) else 'excludes'} the paper's"


def _add_paired_gain_intervals(frame: pd.DataFrame, table: PaperTable, measured: Mapping[str, Measured]) -> None:
    """The gain of each with-variant accuracy cell over its without-variant one as the mean of the
    seeds both ran, paired seed by seed, with its 95 % interval."""
    without, with_ = table.variants
    cells = {(cell.row, cell.column, cell.variant): cell for cell in table.cells if cell.metric == "acc-last-k"}
    for index, cell in enumerate(table.cells):
        base = cells.get((cell.row, cell.column, without))
        if cell.variant != with_ or cell.metric != "acc-last-k" or base is None:
            continue
        gain = paired_interval(measured.get(cell.key, Measured()).per_seed, measured.get(base.key, Measured()).per_seed)
        if gain.seeds >= 2:
            frame.at[index, "paired gain 95% CI"] = gain.text()


def _one_row_per_configuration(frame: pd.DataFrame, table: PaperTable, runs_of: Mapping[str, list[str]]) -> pd.DataFrame:
    """Where --set made the cells of several rows one configuration (``--set strategy=…``
    over a table of methods), that configuration ran or was measured once: it is reported
    once, in the first of its rows, naming the rows it stands for, and compared with none of
    the paper's numbers (it is none of those rows' setups). Every metric: a run cell's
    configuration is its runs, a cost cell's (MFLOPs, parameters) its measured config."""
    changed = {key: value for key, value in table.overrides.items() if key not in NOT_THE_SETUP}
    if not changed:
        return frame
    groups: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    for index, cell in enumerate(table.cells):
        if cell.metric in RUN_METRICS and runs_of.get(cell.key):
            groups.setdefault((cell.metric, tuple(runs_of[cell.key])), []).append(index)
        elif cell.metric in COST_METRICS and cell.config is not None and not cell.reason:
            groups.setdefault((cell.metric, (json.dumps(cell.config, sort_keys=True),)), []).append(index)
    dropped = []
    for indices in groups.values():
        rows = list(dict.fromkeys(table.cells[i].row for i in indices))
        if len(rows) < 2:
            continue
        first, *others = indices
        set_text = ", ".join(f"{key}={value}" for key, value in changed.items())
        frame.loc[first, ["row", "paper", "paper value", "paper ±", "difference", "tolerance", "paper gain",
                          "basin gain", "gain verdict"]] = [" / ".join(rows), "", None, None, None, None, None, None, ""]
        frame.loc[first, "verdict"] = (f"not compared: --set {set_text} makes rows {', '.join(rows)} one configuration, "
                                       f"run once")
        dropped += others
    return frame.drop(index=dropped).reset_index(drop=True)


def _add_gains(frame: pd.DataFrame, variants: Sequence[str], tolerances: Tolerances) -> None:
    without, with_ = variants
    for index, row in frame[(frame["variant"] == with_) & (frame["metric"] == "acc-last-k")].iterrows():
        base = frame[(frame["row"] == row["row"]) & (frame["column"] == row["column"]) & (frame["variant"] == without)]
        if base.empty:
            continue
        base = base.iloc[0]
        if pd.notna(row["paper value"]) and pd.notna(base["paper value"]):
            frame.at[index, "paper gain"] = row["paper value"] - base["paper value"]
        if pd.notna(row["basin"]) and pd.notna(base["basin"]):
            frame.at[index, "basin gain"] = row["basin"] - base["basin"]
        if pd.notna(frame.at[index, "paper gain"]) and pd.notna(frame.at[index, "basin gain"]):
            frame.at[index, "gain verdict"] = gain_verdict(frame.at[index, "paper gain"], frame.at[index, "basin gain"],
                                                           tolerances)


def headline(report: pd.DataFrame) -> str:
    uncompared = report["verdict"].str.startswith("not compared")
    run = report["basin"].notna() & ~uncompared
    matched = report["verdict"].eq("match")
    text = f"{int(matched.sum())} of {int(run.sum())} cells run match the paper ({len(report)} cells in the table"
    not_run = report["verdict"].str.startswith(("not run", "needs data", "interrupted"))
    unsupported = report["verdict"].str.startswith("unsupported")
    missing = report["verdict"].str.startswith("not reported")
    text += f"; {int(not_run.sum())} not run, {int(unsupported.sum())} unsupported, {int(missing.sum())} not reported"
    text += f", {int(uncompared.sum())} configurations not compared: --set made several rows one)" if uncompared.any() else ")"
    gains = report["gain verdict"].ne("") & report["gain verdict"].notna()
    if gains.any():
        text += (f"; gains: {int(report['gain verdict'].eq('gain match').sum())} of {int(gains.sum())} within "
                 f"{TOLERANCES.gain_points} points, {int(report['gain verdict'].isin(['gain match', 'same sign']).sum())} "
                 f"of the same sign")
    return text
