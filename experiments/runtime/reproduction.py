"""Reproduction reports: the papers' tables as data, Basin's runs set beside them.

The implementation behind ``python -m experiments.reproduce`` (its command line answers
``--help`` and usage errors before this module imports torch and Flower).

**The tables** (``experiments/paper_tables/<name>.toml``, one file per paper table) hold
every numeric cell as the paper prints it (``81.17``, ``52.9±0.1``, ``1000+`` for "not
reached within the run", ``N/A`` where the paper reports none, ``lost`` where the text we
copied from lost the number) and how Basin runs it: a preset plus the run-config keys of
the table (``[set]``), its column, its row, its variant (e.g. without / with IMA) and,
rarely, the cell itself, layered in that order. A column, row or cell may instead say why
it cannot be run (``unsupported = "…"``). A cell's metric is the table's, its column's or
its variant's:

- ``acc-last-k``: mean test accuracy (%) of the reported model over the last k rounds
  (k = the run config's ``summary-last-k``), mean ± std over seeds;
- ``rounds-to-target``: the first round whose accuracy reaches ``target-accuracy``;
- ``speed-up``: the reference column's rounds over this column's (IMA Table II);
- ``mflops`` / ``params-m``: forward multiply-adds per training sample (millions) and the
  parameters held during local training (millions), measured on Basin's own client path by
  ``experiments.runtime.method_costs`` (the ``fwd GFLOPs/sample`` column counts 2 FLOPs per
  multiply-add; the papers count one);
- ``seconds``, ``gflops``, ``hessian``: kept as data, never run (each says why).

**Verdicts** (:class:`Tolerances`, docs/reproducing.md): an accuracy within 3 points of the
paper's, or, where the paper gives a ±, within twice the root of the summed squared ± of the
paper and of Basin's seeds (at least 1 point), is a ``match``; rounds within 15 %, both never
reaching the target, or a speed-up within 15 %; costs within 5 %. For a without/with
pair (IMA, WIMA) the "with" cell also gets a gain verdict: ``gain match`` (same sign and
within 1.5 points of the paper's gain), ``same sign`` or ``opposite sign``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from clients.atomic_files import write_atomically
from clients.log import log
from experiments.runtime.machine import ClientResources, data_problem_of
from experiments.runtime.run_config import default_run_config, load_preset, named_toml, read_toml, resolve_config
from experiments.runtime.sweep_runs import Sweep, SweepRun, collect
from strategies.config import ConfigError, cohort_size

TABLES_DIR = Path(__file__).resolve().parents[1] / "paper_tables"
reproduce_log = log.getChild("reproduce")  # its lines say [reproduce]
RUN_METRICS = ("acc-last-k", "rounds-to-target", "speed-up")
COST_METRICS = ("mflops", "params-m")
KEPT_METRICS = ("seconds", "gflops", "hessian")  # data only: a cell with one of these needs an `unsupported` reason
METRICS = (*RUN_METRICS, *COST_METRICS, *KEPT_METRICS)
TABLE_KEYS = {"paper", "table", "caption", "metric", "seeds", "paper-seeds", "variants", "pair", "preset", "set",
              "variant-set", "variant-metric", "columns", "rows", "cells", "values"}
PART_KEYS = {"preset", "set", "metric", "unsupported", "note"}  # a column's, row's or cell's table
# Run-config keys that say where and how a run executes, not what it computes (where the
# data is, devices, threads, process counts, files written, timeouts): a --set of one of
# them leaves the paper's setup as it is.
NOT_THE_SETUP = frozenset({
    "data-dir", "device", "torch-threads", "server-torch-threads", "cuda-graphs", "cuda-deterministic",
    "output-dir", "checkpoint-every", "resume", "round-timeout", "node-timeout", "save-models-every",
    "save-models-last", "save-client-models", "round-indicators", "track", "track-dir", "track-group",
})
# A runnable cell with at least this many client steps per seed is marked "GPU advised":
# about an hour or more on 2 CPU cores (a 300-round Fashion-MNIST cell has 180 000).
GPU_ADVISED_STEPS = 100_000
# Training-split sizes of the built-in sets (for the client-step estimate without loading them).
TRAIN_SIZES = {"digits": 1437, "fashion-mnist": 60_000, "cifar10": 50_000, "cifar100": 50_000}
VALUE = re.compile(r"^\s*(?P<value>-?\d+(?:\.\d+)?)\s*(?:±\s*(?P<spread>\d+(?:\.\d+)?))?\s*(?P<plus>\+)?\s*$")
MISSING = {"n/a": "the paper reports no number (N/A)", "lost": "the number was lost in the text the table was copied from"}


class TableError(ValueError):
    """A paper-table file that cannot be read as written."""


@dataclass(frozen=True)
class PaperValue:
    """One number as the paper prints it."""

    text: str
    value: float | None = None
    spread: float | None = None  # the paper's ± (a standard deviation over its runs)
    censored: bool = False  # "1000+": not reached within the run's rounds
    missing: str = ""  # why there is no number

    @classmethod
    def parse(cls, text: str) -> PaperValue:
        key = text.strip().lower()
        if key in MISSING:
            return cls(text, missing=MISSING[key])
        match = VALUE.match(text.replace(" ", ""))
        if match is None:
            raise TableError(f"value {text!r} is not allowed; allowed: a number, NUMBER±SPREAD, NUMBER+ (not reached), "
                             f"N/A or lost")
        spread = match["spread"]
        return cls(text, float(match["value"]), float(spread) if spread else None, bool(match["plus"]))


@dataclass(frozen=True)
class Cell:
    """One numeric cell of a paper table and how Basin runs it."""

    row: str
    column: str
    variant: str
    paper: PaperValue
    metric: str
    config: Mapping[str, Any] | None  # the resolved run config of seed 0; None when not run
    reason: str = ""  # why it is not run ("" when it is)
    reference_column: str = ""  # speed-up: the column whose rounds are the reference
    recipe: str = ""  # how it runs: the preset and the keys the table sets on top of it
    note: str = ""  # what a reader of the report must know (an inferred placement, a printed inconsistency)

    @property
    def key(self) -> str:
        return " | ".join(part for part in (self.row, self.column, self.variant) if part)


@dataclass(frozen=True)
class PaperTable:
    name: str
    path: Path
    paper: str
    table: str
    caption: str
    seeds: int
    paper_seeds: str
    variants: tuple[str, ...]
    pair: bool
    rows: tuple[str, ...]
    columns: tuple[str, ...]
    cells: tuple[Cell, ...]
    overrides: Mapping[str, Any] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return f"{self.paper}, {self.table}"


# ---- reading a table ---------------------------------------------------------------------

def table_path(name_or_path: str) -> Path:
    """A table name from experiments/paper_tables/ or a TOML file path."""
    return named_toml(name_or_path, TABLES_DIR, "paper table")


def table_names() -> list[str]:
    return sorted(path.stem for path in TABLES_DIR.glob("*.toml"))


def _part(path: Path, where: str, spec: Any, shorthand: bool) -> dict[str, Any]:
    """A column's, row's or cell's table as {preset, set, metric, unsupported}; with
    ``shorthand`` a table without those keys is its ``set``."""
    if not isinstance(spec, dict):
        raise TableError(f"paper table {path}: {where} = {spec!r} is not allowed; allowed: a table")
    if shorthand and not set(spec) & PART_KEYS:
        return {"set": spec}
    unknown = sorted(set(spec) - PART_KEYS)
    if unknown:
        raise TableError(f"paper table {path}: {where} has unknown key(s) {', '.join(unknown)}; "
                         f"allowed: {', '.join(sorted(PART_KEYS))}")
    if "metric" in spec and spec["metric"] not in METRICS:
        raise TableError(f"paper table {path}: {where} metric = {spec['metric']!r}; allowed: {', '.join(METRICS)}")
    return spec


def load_table(name_or_path: str, overrides: Mapping[str, Any] | None = None) -> PaperTable:
    """Read a paper table and resolve every runnable cell's run config (raises TableError or
    ConfigError naming the file and the cell)."""
    path = table_path(name_or_path)
    spec = read_toml(path, "paper table")
    unknown = sorted(set(spec) - TABLE_KEYS)
    if unknown:
        raise TableError(f"paper table {path}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(TABLE_KEYS))}")
    for required in ("paper", "table", "columns", "rows", "values"):
        if required not in spec:
            raise TableError(f"paper table {path}: {required} is missing")
    variants = tuple(spec.get("variants", [""]))
    columns = {name: _part(path, f"[columns.{name!r}]", value, False) for name, value in spec["columns"].items()}
    rows = {name: _part(path, f"[rows] {name!r}", value, True) for name, value in spec["rows"].items()}
    exceptions = {key: _part(path, f"[cells.{key!r}]", value, False) for key, value in spec.get("cells", {}).items()}
    variant_sets = spec.get("variant-set", {})
    variant_metrics = spec.get("variant-metric", {})
    for key in exceptions:
        row, _, column = key.partition(" | ")
        if row not in rows or column not in columns:
            raise TableError(f"paper table {path}: [cells.{key!r}] names no cell; allowed: 'ROW | COLUMN'")
    if set(spec["values"]) != set(rows):
        raise TableError(f"paper table {path}: [values] rows {sorted(spec['values'])} differ from [rows] {sorted(rows)}")
    base_metric = spec.get("metric", "acc-last-k")
    overrides = dict(overrides or {})
    default_dataset = str(default_run_config()["dataset"])

    cells = []
    for row, texts in spec["values"].items():
        if len(texts) != len(columns) * len(variants):
            raise TableError(f"paper table {path}: row {row!r} has {len(texts)} values; expected "
                             f"{len(columns) * len(variants)} ({len(columns)} columns × {len(variants)} variants)")
        for index, text in enumerate(texts):
            column = list(columns)[index // len(variants)]
            variant = variants[index % len(variants)]
            try:
                paper = PaperValue.parse(str(text))
            except TableError as error:
                raise TableError(f"paper table {path}: row {row!r}, column {column!r}: {error}") from None
            parts = [rows[row], columns[column], exceptions.get(f"{row} | {column}", {})]
            metric_spec = variant_metrics.get(variant, {})
            metric = metric_spec.get("metric") or next(
                (p["metric"] for p in reversed(parts) if "metric" in p), base_metric)
            reason = paper.missing or next((p["unsupported"] for p in reversed(parts) if "unsupported" in p), "")
            if not reason and metric in KEPT_METRICS:
                raise TableError(f"paper table {path}: cell {row} | {column}: metric {metric!r} is kept as data only; "
                                 f"give its column an `unsupported` reason")
            config, recipe = None, ""
            if not reason:
                preset = next((p["preset"] for p in reversed(parts) if "preset" in p), spec.get("preset"))
                layers = [load_preset(preset) if preset else {}, spec.get("set", {}), columns[column].get("set", {}),
                          rows[row].get("set", {}), variant_sets.get(variant, {}),
                          exceptions.get(f"{row} | {column}", {}).get("set", {})]
                layers.append(_overrides_for(overrides, layers, default_dataset))
                keys = {k: v for layer in layers[1:] for k, v in layer.items()}
                recipe = " ".join([f"preset {preset}" if preset else "defaults",
                                   *(f"{k}={v}" for k, v in keys.items())])
                try:
                    config = resolve_config(*layers)
                except ConfigError as error:
                    raise ConfigError(f"paper table {path}, cell {row} | {column} {variant}: {error}") from None
            note = " ".join(str(p["note"]).strip() for p in parts if p.get("note"))
            cells.append(Cell(row, column, variant, paper, metric, config, reason,
                              metric_spec.get("reference-column", ""), recipe, note))
    return PaperTable(
        path.stem, path, spec["paper"], spec["table"], spec.get("caption", ""), int(spec.get("seeds", 1)),
        str(spec.get("paper-seeds", "not stated")), variants, bool(spec.get("pair", False)), tuple(rows),
        tuple(columns), tuple(cells), overrides,
    )


def _overrides_for(overrides: Mapping[str, Any], layers: Sequence[Mapping[str, Any]], default_dataset: str) -> dict[str, Any]:
    """The --set overrides of a cell whose other layers are ``layers``: ``data-dir`` (where the
    Fashion-MNIST files are) only reaches the cells that read it, so one table's command can name it."""
    dataset = next((layer["dataset"] for layer in reversed(layers) if "dataset" in layer), default_dataset)
    if dataset == "fashion-mnist":
        return dict(overrides)
    return {key: value for key, value in overrides.items() if key != "data-dir"}


def select(table: PaperTable, only: Sequence[str]) -> PaperTable:
    """The cells matching every ``--only`` filter: each a comma-separated list of terms; a
    term matches a cell whose row or column is the term (any case) or whose column
    contains it."""
    def matches(cell: Cell, terms: list[str]) -> bool:
        return any(term.lower() in (cell.row.lower(), cell.column.lower()) or term.lower() in cell.column.lower()
                   for term in terms)

    filters = [[t.strip() for t in group.split(",") if t.strip()] for group in only]
    kept = tuple(cell for cell in table.cells if all(matches(cell, terms) for terms in filters))
    if not kept:
        raise TableError(f"--only {' --only '.join(only)} matches no cell of {table.name}; rows: "
                         f"{', '.join(table.rows)}; columns: {', '.join(table.columns)}")
    return dataclasses.replace(table, cells=kept)


# ---- what can run here ---------------------------------------------------------------------

def local_steps_per_round(config: Mapping[str, Any]) -> int | None:
    """Local steps one client takes per round, for the mean partition size (None when the
    data set's size is not known without loading it)."""
    size = TRAIN_SIZES.get(str(config["dataset"]))
    if size is None:
        return None
    per_client = size / max(1, int(config["num-clients"]))
    return int(config["local-epochs"]) * max(1, math.ceil(per_client / int(config["batch-size"])))


def client_steps(config: Mapping[str, Any]) -> int | None:
    """Client steps of one run (rounds × cohort × local steps), or None when unknown."""
    steps = local_steps_per_round(config)
    return None if steps is None else int(config["num-rounds"]) * cohort_size(config) * steps


def cell_status(cell: Cell) -> str:
    """``not reported``, ``unsupported``, ``cost`` (computed here on the CPU),
    ``needs data`` (its data set cannot be loaded here), ``GPU advised`` or ``runnable``."""
    if cell.paper.missing:
        return "not reported"
    if cell.reason:
        return "unsupported"
    if cell.metric in COST_METRICS:
        return "cost"
    if data_problem_of(cell.config) is not None:
        return "needs data"
    steps = client_steps(cell.config)
    return "GPU advised" if steps is not None and steps >= GPU_ADVISED_STEPS else "runnable"


def table_counts(table: PaperTable) -> dict[str, int]:
    counts = {"cells": len(table.cells)}
    for cell in table.cells:
        status = cell_status(cell)
        counts[status] = counts.get(status, 0) + 1
    return counts


# ---- runs ------------------------------------------------------------------------------

def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "x"


def seed_config(config: Mapping[str, Any], seed: int) -> dict[str, Any]:
    return {**config, "seed": seed}


def run_cells(table: PaperTable) -> list[Cell]:
    """The cells that need Flower runs: a run metric, a config, and not a derived speed-up."""
    return [c for c in table.cells if c.config is not None and c.metric in ("acc-last-k", "rounds-to-target")]


def build_sweep(table: PaperTable, seeds: int, resources: ClientResources | None = None) -> tuple[Sweep, dict[str, list[str]]]:
    """The sweep of every run the table's cells need (seeds 0 … seeds−1 each; cells with the
    same config share runs) and, per cell key, its run ids."""
    runs: list[SweepRun] = []
    by_config: dict[str, str] = {}
    runs_of: dict[str, list[str]] = {}
    for cell in run_cells(table):
        ids = []
        for seed in range(seeds):
            config = seed_config(cell.config, seed)
            fingerprint = json.dumps(config, sort_keys=True)
            if fingerprint not in by_config:
                run_id = f"{_slug(cell.row)}_{_slug(cell.column)}{'_' + _slug(cell.variant) if cell.variant else ''}_seed={seed}"
                by_config[fingerprint] = run_id
                runs.append(SweepRun(run_id, config))
            ids.append(by_config[fingerprint])
        runs_of[cell.key] = ids
    return Sweep(f"reproduce-{table.name}", runs, resources or ClientResources(1, 0.0), 0, True), runs_of


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
        return Measured(float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0, len(values))
    rounds = done["rounds-to-target"].astype(float)
    reached = rounds.dropna()
    if reached.empty:
        return Measured(float(done["rounds"].max()), 0.0, len(done), censored=True)
    if len(reached) < len(rounds):
        # A seed that missed would have needed more rounds than it ran: the mean over every
        # seed, each missed one counted at its last round, is a lower bound, not a value.
        bound = rounds.fillna(done["rounds"].astype(float)).mean()
        return Measured(float(bound), 0.0, len(done), reached=len(reached))
    return Measured(float(reached.mean()), float(reached.std(ddof=1)) if len(reached) > 1 else 0.0, len(done))


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


def _format(value: float | None, censored: bool = False, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.0f}+" if censored else f"{value:.{digits}f}"


def basin_text(row: Mapping[str, Any]) -> str:
    """Basin's number of a report row as shown: ``1000+`` when no seed reached the target,
    ``≥ 412 (2 of 3 seeds reached)`` when some did not (the mean is then a lower bound)."""
    rounds = row["metric"] == "rounds-to-target"
    reached = row.get("basin reached")
    if reached is not None and not pd.isna(reached) and row["basin"] is not None:
        return f"≥ {row['basin']:g} ({int(reached)} of {int(row['seeds'])} seeds reached)"
    return _format(row["basin"], bool(row["basin censored"]), 0 if rounds else 2)


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
            "paper": cell.paper.text, "paper value": cell.paper.value, "paper ±": cell.paper.spread,
            "basin": basin.value, "seeds": basin.seeds,
            "basin std": basin.std if basin.seeds > 1 and not basin.censored and basin.reached is None else None,
            "basin censored": basin.censored, "basin reached": basin.reached,
            "difference": (basin.value - cell.paper.value) if basin.value is not None and cell.paper.value is not None
            and not basin.censored and not cell.paper.censored and basin.reached is None else None,
            "tolerance": tolerance, "verdict": outcome, "paper gain": None, "basin gain": None, "gain verdict": "",
            "note": cell.note,
        }
        rows.append(row)
    frame = pd.DataFrame(rows)
    if table.pair and len(table.variants) == 2:
        _add_gains(frame, table.variants, tolerances)
    return frame


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
    run = report["basin"].notna()
    matched = report["verdict"].eq("match")
    text = f"{int(matched.sum())} of {int(run.sum())} cells run match the paper ({len(report)} cells in the table"
    not_run = report["verdict"].str.startswith(("not run", "needs data", "interrupted"))
    unsupported = report["verdict"].str.startswith("unsupported")
    missing = report["verdict"].str.startswith("not reported")
    text += f"; {int(not_run.sum())} not run, {int(unsupported.sum())} unsupported, {int(missing.sum())} not reported)"
    gains = report["gain verdict"].ne("") & report["gain verdict"].notna()
    if gains.any():
        text += (f"; gains: {int(report['gain verdict'].eq('gain match').sum())} of {int(gains.sum())} within "
                 f"{TOLERANCES.gain_points} points, {int(report['gain verdict'].isin(['gain match', 'same sign']).sum())} "
                 f"of the same sign")
    return text


# ---- costs (MFLOPs, parameters) ---------------------------------------------------------------

def measure_costs(table: PaperTable, out_dir: Path, steps: int = 10, progress: bool = True,
                  cached_only: bool = False) -> dict[str, float]:
    """MFLOPs (forward multiply-adds per sample, millions) and parameters held (millions)
    of every cost cell, measured by experiments.runtime.method_costs on this machine's CPU and kept
    in ``costs.json`` (a later call reads them back; ``cached_only``: only those)."""
    cells = [c for c in table.cells if c.metric in COST_METRICS and c.config is not None]
    if not cells:
        return {}
    cache_path = out_dir / "costs.json"
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, json.JSONDecodeError):
        cache = {}
    values = {}
    for cell in cells:
        fingerprint = json.dumps({**cell.config, "steps": steps}, sort_keys=True)
        if fingerprint not in cache:
            if cached_only:
                continue
            cache[fingerprint] = _cost_of(cell.config, steps, progress)
            write_atomically(cache_path, json.dumps(cache, indent=1).encode())
        measured = cache[fingerprint]
        values[cell.key] = measured["mflops"] if cell.metric == "mflops" else measured["params-m"]
    return values


def _cost_of(config: Mapping[str, Any], steps: int, progress: bool) -> dict[str, float]:
    import torch

    from experiments.runtime.method_costs import measure
    from partitions.datasets import INPUT_SHAPES

    shape = INPUT_SHAPES[str(config["dataset"])]
    num_classes = 100 if config["dataset"] == "cifar100" else 10
    if progress:
        reproduce_log.info(f"measuring {config['strategy']} on {config['model']} ({steps} steps on the CPU) …")
    cost = measure(str(config["strategy"]), {**config, "device": "cpu"}, str(config["model"]), shape, num_classes,
                   int(config["batch-size"]), steps, torch.device("cpu"))
    return {"mflops": cost.forward_flops / 2 / 1e6, "params-m": cost.held_elements / 1e6}


# ---- the report's files ---------------------------------------------------------------

def report_markdown(table: PaperTable, report: pd.DataFrame) -> str:
    lines = [f"# {table.title}: Basin beside the paper", "", table.caption, "",
             f"**{headline(report)}**", "",
             f"Paper's seeds: {table.paper_seeds}. Basin's: the seeds finished per cell (column `seeds`)."]
    setup = {k: v for k, v in table.overrides.items() if k not in NOT_THE_SETUP}
    placement = {k: v for k, v in table.overrides.items() if k in NOT_THE_SETUP}
    if setup:
        changed = ", ".join(f"{k} = {v!r}" for k, v in setup.items())
        lines += ["", f"**Not the paper's setup**: every run was changed by --set {changed}."]
    if placement:
        where = ", ".join(f"{k} = {v!r}" for k, v in placement.items())
        lines += ["", f"Run with --set {where}: where and how the runs executed, not what they compute."]
    lines += ["", "| row | column | variant | paper | Basin | Basin − paper | verdict | paper gain | Basin gain | gain verdict |",
              "| --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | --- |"]
    notes: dict[str, int] = {}
    for _, r in report.iterrows():
        basin = basin_text(r)
        if basin and pd.notna(r["basin std"]):
            basin += f" ± {r['basin std']:.2f}"
        paper = r["paper"]
        if r.get("note"):
            paper += f" [{notes.setdefault(r['note'], len(notes) + 1)}]"
        lines.append(
            f"| {r['row']} | {r['column']} | {r['variant']} | {paper} | {basin} | {_format(r['difference'])} | "
            f"{r['verdict']} | {_format(r['paper gain'])} | {_format(r['basin gain'])} | {r['gain verdict']} |")
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
        "paper": report["paper"],
        "Basin": [basin_text(r) for _, r in report.iterrows()],
        "diff": [_format(v) for v in report["difference"]],
        "verdict": [v if len(v) < 60 else v[:57] + "…" for v in report["verdict"]],
        "gain (paper/Basin)": [f"{_format(p)}/{_format(b)} {g}" if g else "" for p, b, g in
                               zip(report["paper gain"], report["basin gain"], report["gain verdict"])],
    })
    return shown.to_string(index=False)


# ---- dry run ---------------------------------------------------------------------------

def step_seconds(configs: Iterable[Mapping[str, Any]], progress: bool = True) -> dict[tuple, float]:
    """Median seconds of one local step on this machine's device, per (model, data set,
    batch size, strategy), measured on Basin's client path (2 steps each)."""
    from clients.training import select_device
    from experiments.runtime.method_costs import measure
    from partitions.datasets import INPUT_SHAPES

    device = select_device("auto")
    seconds: dict[tuple, float] = {}
    for config in configs:
        key = _step_key(config)
        if key in seconds or str(config["dataset"]) not in INPUT_SHAPES:
            continue
        if progress:
            reproduce_log.info(f"timing {config['strategy']} on {config['model']} ({device}) …")
        num_classes = 100 if config["dataset"] == "cifar100" else 10
        cost = measure(str(config["strategy"]), {**config, "device": device.type}, str(config["model"]),
                       INPUT_SHAPES[str(config["dataset"])], num_classes, int(config["batch-size"]), 2, device,
                       count_flops=False)
        seconds[key] = cost.seconds_per_step
    return seconds


def _step_key(config: Mapping[str, Any]) -> tuple:
    return (config["model"], config["dataset"], config["batch-size"], config["strategy"])


def dry_run_table(table: PaperTable, seeds: int, timing: bool = True) -> tuple[pd.DataFrame, str]:
    """Each cell with the paper's value, its status, the run it needs and its compute; and
    a closing line with the totals."""
    runnable = run_cells(table)
    run_keys = {c.key for c in runnable}
    seconds = step_seconds((c.config for c in runnable), progress=True) if timing else {}
    rows, seen, total_steps, total_seconds, unknown = [], set(), 0, 0.0, 0
    for cell in table.cells:
        steps = client_steps(cell.config) if cell.key in run_keys else None
        per_step = seconds.get(_step_key(cell.config)) if steps is not None else None
        fingerprint = json.dumps(cell.config, sort_keys=True) if cell.config is not None else None
        if steps is not None and fingerprint not in seen:  # cells sharing a run count once
            seen.add(fingerprint)
            total_steps += steps * seeds
            total_seconds += (per_step or 0.0) * steps * seeds
            unknown += per_step is None
        rows.append({
            "cell": cell.key, "paper": cell.paper.text, "metric": cell.metric, "status": cell_status(cell),
            "run": cell.recipe if cell.config is not None else (cell.reason or cell.paper.missing),
            "client-steps/seed": steps, "hours/seed": steps * per_step / 3600 if steps and per_step else None,
        })
    device = "this machine's device"
    total = (f"{len(runnable)} run cells × {seeds} seeds: {total_steps:,} client steps"
             + (f", about {total_seconds / 3600:,.1f} device-hours on {device} one client at a time" if timing else "")
             + (f" ({unknown} cells of unknown data size or step time not counted in the hours)" if unknown and timing else ""))
    return pd.DataFrame(rows), total


def results_of(table: PaperTable, out_dir: Path, seeds: int) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """The sweep table of the table's runs as they stand in ``out_dir`` (finished or not)."""
    sweep, runs_of = build_sweep(table, seeds)
    results, _ = collect(sweep, out_dir) if sweep.runs else (pd.DataFrame(columns=["run", "status"]), None)
    return results, runs_of


# ---- command line -------------------------------------------------------------------------

def list_tables(overrides: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """One row per table: its cells and how many are runnable here, advised for a GPU, need
    data this machine lacks, are cost cells (computed here), unsupported or not reported."""
    rows = []
    for name in table_names():
        table = load_table(name, overrides)
        counts = table_counts(table)
        reasons = sorted({c.reason for c in table.cells if c.reason and not c.paper.missing})
        rows.append({"table": name, "paper": table.title, "cells": counts["cells"],
                     "runnable here": counts.get("runnable", 0), "GPU advised": counts.get("GPU advised", 0),
                     "needs data": counts.get("needs data", 0), "cost (CPU)": counts.get("cost", 0),
                     "unsupported": counts.get("unsupported", 0), "not reported": counts.get("not reported", 0),
                     "why unsupported": "; ".join(reasons)})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Reproduction:
    """What reproducing a table gave: the report (one row per cell, as report.csv), its
    headline, its files (report.md, report.csv, report.png) and whether every run that can
    run here finished (``failed``: the runs that did not)."""

    table: PaperTable
    out: Path
    report: pd.DataFrame
    files: list[Path]
    failed: list[str]

    @property
    def headline(self) -> str:
        return headline(self.report)


def reproduce_table(table_name: str, only: Sequence[str] = (), seeds: int | None = None,
                    overrides: Mapping[str, Any] | None = None, out: Path | None = None, parallel: int | None = 1,
                    mps: bool = False, ray_address: str | None = None, retry_failed: bool = False,
                    report_only: bool = False, progress: bool = True) -> Reproduction:
    """Run a table's cells (those ``only`` keeps; resumable, finished runs reused) and write
    its report; KeyboardInterrupt propagates once the running runs are stopped (the same
    call resumes them). The report covers the whole table: cells outside ``only`` show what
    earlier calls ran."""
    from experiments.runtime.sweep_runs import execute_sweep

    whole = load_table(table_name, overrides)
    table = select(whole, only) if only else whole
    seeds = seeds or table.seeds
    out_dir = (out or Path("runs") / "reproduce" / table.name).resolve()
    sweep, _ = build_sweep(table, seeds)
    reproduce_log.info(f"{table.title}: {len(table.cells)} cells, {len(sweep.runs)} runs ({seeds} seeds) → {out_dir}")
    problems = {run.run_id: data_problem_of(run.config) for run in sweep.runs}
    here = dataclasses.replace(sweep, runs=[run for run in sweep.runs if problems[run.run_id] is None])
    if len(here.runs) < len(sweep.runs):
        reasons = sorted({problem for problem in problems.values() if problem})
        reproduce_log.warning(f"{len(sweep.runs) - len(here.runs)} runs cannot load their data here and are not run "
                              f"(their cells say so in the report): {reasons[0]}")
    failed: list[str] = []
    if here.runs and not report_only:
        _, runs_table = execute_sweep(here, out_dir, retry_failed=retry_failed, progress=progress,
                                      ray_address=ray_address, parallel=parallel, mps=mps)
        failed = runs_table.loc[runs_table["status"].eq("failed"), "run"].tolist()
    out_dir.mkdir(parents=True, exist_ok=True)
    costs = measure_costs(table, out_dir, progress=progress)
    costs = {**measure_costs(whole, out_dir, progress=False, cached_only=True), **costs}
    results, runs_of = results_of(whole, out_dir, seeds)
    report = compare(whole, results, runs_of, costs)
    return Reproduction(whole, out_dir, report, write_report(whole, report, out_dir), failed)


def run_command(args) -> int:
    """List, dry-run, or run and report a table (see experiments/reproduce.py)."""
    from experiments.runtime.cli import EXIT_INTERRUPTED
    from experiments.runtime.run_config import parse_overrides

    overrides = parse_overrides(args.set)
    if args.list:
        listing = list_tables(overrides)
        with pd.option_context("display.max_colwidth", 90, "display.width", 250):
            print(listing.drop(columns="why unsupported").to_string(index=False))
        print()
        for _, row in listing[listing["why unsupported"] != ""].iterrows():
            print(f"{row['table']} unsupported: {row['why unsupported']}")
        print("\nrunnable here: its data loads on this machine; GPU advised: runnable, ≥ "
              f"{GPU_ADVISED_STEPS:,} client steps per seed (hours on 2 CPU cores); needs data: its data set is not on "
              "this machine (CIFAR downloads where the hub is reachable); cost: MFLOPs/parameters measured here on the CPU")
        return 0
    if args.dry_run:
        table = load_table(args.table, overrides)
        table = select(table, args.only) if args.only else table
        seeds = args.seeds or table.seeds
        cells, total = dry_run_table(table, seeds, timing=not args.no_timing)
        with pd.option_context("display.max_colwidth", 120, "display.width", 250):
            print(f"{table.title} ({table.name}): {len(table.cells)} cells, seeds 0–{seeds - 1}\n")
            print(cells.to_string(index=False))
        print(f"\n{total}")
        return 0
    try:
        done = reproduce_table(args.table, args.only, args.seeds, overrides, args.out, args.parallel, args.mps,
                               args.ray_address, args.retry_failed, args.report_only, progress=not args.no_progress)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    with pd.option_context("display.max_colwidth", 80, "display.width", 250):
        print(printed_table(done.report))
    print(f"\n{done.headline}")
    print(f"report: {', '.join(str(f) for f in done.files)}")
    return 1 if done.failed else 0
