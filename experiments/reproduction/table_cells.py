"""The papers' tables as data: every numeric cell as the paper prints it, and the Basin
run that reproduces it (or why none can).

Each table (``experiments/paper_tables/<name>.toml``) holds its cells as printed (``81.17``,
``52.9±0.1``, ``1000+`` for "not reached within the run", ``N/A`` where the paper reports
none, ``lost`` where the text we copied from lost the number) and how Basin runs each: a
preset plus the run-config keys of the table (``[set]``), its column, its row, its variant
(e.g. without / with IMA) and, rarely, the cell itself, layered in that order; a column,
row or cell may instead say why it cannot run (``unsupported``) or what a reader must know
(``note``). A cell's metric is ``acc-last-k``, ``rounds-to-target``, ``speed-up``,
``mflops``/``params-m``, or one kept as data only (docs/reproducing.md).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.reproduction.estimates import estimate
from experiments.runtime.machine import data_problem_of
from experiments.runtime.run_config import default_run_config, load_preset, named_toml, read_toml, resolve_config
from strategies.config import ConfigError

TABLES_DIR = Path(__file__).resolve().parents[1] / "paper_tables"
RUN_METRICS = ("acc-last-k", "rounds-to-target", "speed-up")
COST_METRICS = ("mflops", "params-m")
KEPT_METRICS = ("seconds", "gflops", "hessian")  # data only: a cell with one of these needs an `unsupported` reason
METRICS = (*RUN_METRICS, *COST_METRICS, *KEPT_METRICS)
# The unit of each metric's values in a table and in Basin's report beside it: accuracy in
# percent, as the papers print it (every file a run or a sweep writes holds fractions).
METRIC_UNITS = {"acc-last-k": "%", "rounds-to-target": "rounds", "speed-up": "×", "mflops": "MFLOPs",
                "params-m": "M parameters", "seconds": "s", "gflops": "GFLOPs", "hessian": "eigenvalue"}
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


def load_table(name_or_path: str, overrides: Mapping[str, Any] | None = None, build_partitions: bool = True) -> PaperTable:
    """Read a paper table and resolve every runnable cell's run config (raises TableError or
    ConfigError naming the file and the cell); ``build_partitions`` False leaves out the
    check that each cell's partition can be built (resolve_config's ``build_partition``)."""
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
                    config = resolve_config(*layers, build_partition=build_partitions)
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
    return "GPU advised" if estimate(cell.config).gpu_advised else "runnable"


def table_counts(table: PaperTable) -> dict[str, int]:
    counts = {"cells": len(table.cells)}
    for cell in table.cells:
        status = cell_status(cell)
        counts[status] = counts.get(status, 0) + 1
    return counts
