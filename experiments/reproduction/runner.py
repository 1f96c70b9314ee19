"""Reproducing a paper's table: the runs its cells need (through the sweep machinery:
resumable, parallel), the cost cells measured on the CPU, the report written
(``.venv/bin/python -m experiments.reproduce`` and ``experiments.api.reproduce``; the command line
answers ``--help`` and usage errors before this module imports torch and Flower).

The tables: experiments/reproduction/table_cells.py; the verdicts: experiments/reproduction/verdicts.py;
the report's files: experiments/reproduction/report_files.py.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from clients.atomic_files import write_atomically
from clients.log import log
from experiments.reproduction.estimates import GPU_ADVISED_CPU_SECONDS, client_steps, duration, estimate
from experiments.reproduction.report_files import printed_table, setup_lines, write_report
from experiments.reproduction.table_cells import (
    COST_METRICS,
    Cell,
    PaperTable,
    cell_status,
    load_table,
    select,
    table_counts,
    table_names,
)
from experiments.reproduction.verdicts import compare, headline
from experiments.runtime.machine import ClientResources, data_problem_of
from experiments.runtime.sweep_definition import Sweep, SweepRun
from experiments.runtime.sweep_runs import collect

reproduce_log = log.getChild("reproduce")  # its lines say [reproduce]

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


# ---- costs (MFLOPs, parameters) ---------------------------------------------------------------

def measure_costs(table: PaperTable, out_dir: Path, steps: int = 10, progress: bool = True,
                  cached_only: bool = False) -> dict[str, float]:
    """MFLOPs (forward multiply-adds per sample, millions) and parameters held (millions)
    of every cost cell, measured by experiments.measurement.method_costs on this machine's CPU and kept
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

    from experiments.measurement.method_costs import measure
    from partitions.datasets import INPUT_SHAPES

    shape = INPUT_SHAPES[str(config["dataset"])]
    num_classes = 100 if config["dataset"] == "cifar100" else 10
    if progress:
        reproduce_log.info(f"measuring {config['strategy']} on {config['model']} ({steps} steps on the CPU) …")
    cost = measure(str(config["strategy"]), {**config, "device": "cpu"}, str(config["model"]), shape, num_classes,
                   int(config["batch-size"]), steps, torch.device("cpu"), timed=False)  # no time cell reads them
    return {"mflops": cost.forward_flops / 2 / 1e6, "params-m": cost.held_elements / 1e6}


# ---- dry run ---------------------------------------------------------------------------

def step_seconds(configs: Iterable[Mapping[str, Any]], progress: bool = True) -> dict[tuple, float]:
    """Median seconds of one local step on this machine's device, per (model, data set,
    batch size, strategy), measured on Basin's client path (2 steps each)."""
    from clients.training import select_device
    from experiments.measurement.method_costs import measure
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
            "estimate/seed (2 CPU cores; GPU)": estimate(cell.config).text() if steps is not None else "",
        })
    device = "this machine's device"
    total = (f"{len(runnable)} run cells × {seeds} seeds: {total_steps:,} client steps"
             + (f", about {total_seconds / 3600:,.1f} device-hours on {device} one client at a time" if timing else "")
             + (f" ({unknown} cells of unknown data size or step time not counted in the hours)" if unknown and timing else ""))
    return pd.DataFrame(rows), total


def dry_run_cells(table_name: str, only: Sequence[str] = (), seeds: int | None = None,
                  overrides: Mapping[str, Any] | None = None, timing: bool = True) -> tuple[PaperTable, pd.DataFrame, str]:
    """The table (``only``'s cells), its dry run's cells and the closing line (:func:`dry_run_table`)."""
    table = load_table(table_name, overrides)
    table = select(table, only) if only else table
    cells, total = dry_run_table(table, seeds or table.seeds, timing)
    return table, cells, total


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
        # Read, not run: building every cell's partition took 5 of the listing's 6.7 s (2 cores).
        table = load_table(name, overrides, build_partitions=False)
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
        print("\nrunnable here: its data loads on this machine; GPU advised: runnable, estimated over "
              f"{duration(GPU_ADVISED_CPU_SECONDS)} a seed on 2 CPU cores (its client steps × its model's measured step; "
              f"a 300-round Fashion-MNIST cell: 17 min; experiments/reproduction/estimates.py); needs data: its data set is not on "
              "this machine (CIFAR downloads where the hub is reachable); cost: MFLOPs/parameters measured here on the CPU")
        return 0
    if args.dry_run:
        table, cells, total = dry_run_cells(args.table, args.only, args.seeds, overrides, timing=not args.no_timing)
        seeds = args.seeds or table.seeds
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
    for line in setup_lines(done.table):
        print(f"\n{line.replace('**', '')}")
    print(f"\n{done.headline}")
    print(f"report: {', '.join(str(f) for f in done.files)}")
    return 1 if done.failed else 0
