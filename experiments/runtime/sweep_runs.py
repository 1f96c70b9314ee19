"""Running a sweep's runs (experiments/runtime/sweep_definition.py), resumable and in
parallel, and collecting its tables: for ``.venv/bin/python -m experiments.sweep`` (whose
command line answers ``--help`` and usage errors before this module imports torch and
Flower), the Python API, the reproductions and the benchmarks.
"""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import pandas as pd

from clients.atomic_files import write_atomically
from clients.log import log
from experiments.runtime.cli import DiskFull
from experiments.runtime.launch import launch, process_wide_settings
from experiments.runtime.machine import (
    CLIENT_PROCESS_GPU_BYTES,
    ClientResources,
    DataUnavailable,
    check_machine,
    check_trackers,
    client_resources,
    cuda_available,
    data_problem_of,
    machine_cpus,
)
from experiments.runtime.mps import MpsDaemon, check_mps
from experiments.runtime.output_dir import OutputLock, create_output_dir
from experiments.runtime.ray_cluster import LocalRayCluster
from experiments.runtime.run_config import tracked_in
from experiments.runtime.run_endings import RunFailed, end_summary, interrupted_reason
from experiments.runtime.sweep_definition import Sweep, SweepRun
from strategies.checkpoint import CheckpointError, read_checkpoint
from strategies.cohort import cohort_size
from strategies.results import RENAMED_ROUND_COLUMNS, current_summary, write_json_atomic

# The summary.json keys the results table has a column of, under the same names.
SUMMARY_COLUMNS = ("acc-last-k", "acc-best", "best-round", "acc-final", "rounds-to-target", "time-to-target",
                   "simulated-time", "rounds", "wall-seconds", "last-k")


def _comparable(config: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in config.items() if key != "output-dir"}


def read_outcome(run_dir: Path, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The finished outcome of a run with this config, or None (never run, interrupted, or
    run with another config)."""
    try:
        outcome = json.loads((run_dir / "outcome.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return outcome if outcome.get("config") == _comparable(config) else None


def resumable(run_dir: Path, config: dict[str, Any]) -> bool:
    """Whether an interrupted attempt left a checkpoint this run can continue from."""
    try:
        return read_checkpoint(run_dir, config) is not None
    except CheckpointError:
        return False


def pending_runs(sweep: Sweep, out_dir: Path, retry_failed: bool = False) -> list[SweepRun]:
    """The runs without a finished outcome of their config (and, with ``retry_failed``, the failed ones)."""
    todo = []
    for run in sweep.runs:
        outcome = read_outcome(out_dir / "runs" / run.run_id, run.config)
        if outcome is None or (retry_failed and outcome["status"] == "failed"):
            todo.append(run)
    return todo


def run_sweep(
    sweep: Sweep, out_dir: Path, retry_failed: bool = False, progress: bool = True, ray_address: str | None = None,
    parallel: int = 1,
) -> pd.DataFrame:
    """Run every unfinished run of the sweep, rebuilding the tables after each; return the results table.

    ``parallel``: how many runs go at once, each its own Flower run (SuperLink, simulation;
    Ray and client processes unless ``ray_address`` is the job's) in a thread of this
    process; a run's numbers do not depend on it. With more than one, only the sweep's bar
    is drawn. Ctrl-C (KeyboardInterrupt) stops every running run, then propagates.
    ``ray_address``: run the clients on that existing Ray cluster
    (``experiments.runtime.ray_cluster``).
    """
    from experiments.runtime.progress import progress_bar

    out_dir.mkdir(parents=True, exist_ok=True)
    todo = pending_runs(sweep, out_dir, retry_failed)
    finished = len(sweep.runs) - len(todo)
    stop, tables_lock = threading.Event(), threading.Lock()
    with progress_bar(total=len(sweep.runs), initial=finished, desc=f"sweep {sweep.name}", unit="run", disable=not progress) as bar:

        def run_one(run: SweepRun) -> None:
            if stop.is_set():  # interrupted before this run started: it stays pending
                return
            run_dir = out_dir / "runs" / run.run_id
            if not resumable(run_dir, run.config):
                shutil.rmtree(run_dir, ignore_errors=True)  # an outdated attempt, or one without a checkpoint
            started = time.time()
            try:
                launch(tracked_in(run.config, out_dir, sweep.name), run_dir, sweep.resources,
                       progress=progress and parallel == 1, label=run.run_id,
                       leave=False, ray_address=ray_address, stop=stop)
                outcome = {"status": "completed", "error": ""}
            except DiskFull:
                stop.set()  # every later run would fail the same way: this one stays pending, the others stop
                raise
            except RunFailed as error:
                if stop.is_set():
                    # Its processes died with the interrupt (a signal to the whole process group,
                    # as `timeout` and a terminal's Ctrl-C send): interrupted, not failed; no
                    # outcome, so the same command resumes it.
                    end_summary(run_dir, run.config, "interrupted", interrupted_reason(run_dir, run.config))
                    return
                outcome = {"status": "failed", "error": str(error).splitlines()[0]}
            except Exception as error:  # the sweep goes on; the run records why it failed
                outcome = {"status": "failed", "error": f"{type(error).__name__}: {error}"}
            outcome.update({"run-seconds": time.time() - started, "config": _comparable(run.config)})
            write_json_atomic(run_dir / "outcome.json", outcome)
            with tables_lock:
                write_tables(sweep, out_dir)
                bar.update(1)
                if outcome["status"] == "failed":
                    bar.write(f"run {run.run_id} failed: {outcome['error']}")

        if parallel == 1:
            for run in todo:
                run_one(run)
        else:
            with ThreadPoolExecutor(max_workers=parallel) as pool:
                futures = [pool.submit(run_one, run) for run in todo]
                try:
                    for future in as_completed(futures):
                        future.result()
                except (KeyboardInterrupt, DiskFull):
                    stop.set()  # each running launch stops its processes and records "interrupted"
                    for future in futures:
                        future.cancel()
                    raise
    return write_tables(sweep, out_dir)


def collect(sweep: Sweep, out_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The results table (one row per run) and the per-round curves, from the run directories."""
    rows, curves = [], []
    for run in sweep.runs:
        run_dir = out_dir / "runs" / run.run_id
        outcome = read_outcome(run_dir, run.config)
        row = {"run": run.run_id, "status": "pending", "error": "", **_comparable(run.config)}
        if outcome is None:  # pending; one an earlier command left part-way says where it stopped
            row["error"] = _where_it_stopped(run_dir, run.config)
        else:
            row.update(status=outcome["status"], error=outcome["error"], **{"run-seconds": outcome["run-seconds"]})
            row.update(_summary_columns(run_dir))
            try:
                curves.append(pd.read_csv(run_dir / "results.csv").rename(columns=RENAMED_ROUND_COLUMNS).assign(run=run.run_id))
            except (OSError, pd.errors.EmptyDataError):
                pass
        row["run-dir"] = str(run_dir.relative_to(out_dir))
        rows.append(row)
    table = pd.DataFrame(rows)
    for column in (*SUMMARY_COLUMNS, "run-seconds"):
        table[column] = pd.to_numeric(table.get(column), errors="coerce") if column in table else float("nan")
    curve_table = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(columns=["run", "round"])
    return table, curve_table[["run", *[c for c in curve_table.columns if c != "run"]]]


def _where_it_stopped(run_dir: Path, config: Mapping[str, Any]) -> str:
    """For a pending run that an earlier command interrupted (or whose launcher died):
    "interrupted at round r of R — run the same command to resume"; else ''."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return ""
    if summary.get("status") not in ("interrupted", "killed"):  # "running": under way now (a parallel sweep)
        return ""
    return f"interrupted at round {summary.get('rounds', 0)} of {config['num-rounds']} — run the same command to resume"


def _summary_columns(run_dir: Path) -> dict[str, Any]:
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    summary = current_summary(summary)
    return {column: summary.get(column) for column in SUMMARY_COLUMNS}


def write_tables(sweep: Sweep, out_dir: Path) -> pd.DataFrame:
    """Rebuild results.parquet/.csv and curves.parquet, each replaced atomically."""
    table, curves = collect(sweep, out_dir)
    write_atomically(out_dir / "results.parquet", _parquet(table))
    write_atomically(out_dir / "results.csv", table.to_csv(index=False).encode())
    write_atomically(out_dir / "curves.parquet", _parquet(curves))
    return table


def _parquet(frame: pd.DataFrame) -> memoryview:
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return buffer.getbuffer()


# ---- command line -------------------------------------------------------------------

# --parallel auto on a GPU: at most this many runs at once (beyond it the GPU, not the
# launchers' start-up, is what the runs wait for).
AUTO_PARALLEL_MAX = 4


def auto_parallel(sweep: Sweep) -> int:
    """``--parallel auto``: 1 on CPU (one run's clients already use every core); on a GPU
    up to AUTO_PARALLEL_MAX runs, as many as fit in free GPU memory with a whole cohort
    each (launch.CLIENT_PROCESS_GPU_BYTES per client process); printed."""
    if not cuda_available() or all(run.config["device"] == "cpu" for run in sweep.runs):
        return 1
    import torch

    cohort = max(cohort_size(run.config) for run in sweep.runs)
    free_bytes, _ = torch.cuda.mem_get_info()
    parallel = max(1, min(AUTO_PARALLEL_MAX, len(sweep.runs), free_bytes // (CLIENT_PROCESS_GPU_BYTES * cohort)))
    log.info(f"--parallel auto: {parallel} runs at once")
    return parallel


def shares_one_ray_cluster(resources: ClientResources, runs: list[SweepRun], parallel: int) -> bool:
    """Whether the job's runs share one Ray cluster that it starts (started inside MPS, if
    asked), and with it their client processes, instead of each run starting its own Ray:
    runs one after another always; runs at once only on CPUs, and only where they fix the
    same process-wide settings. On a GPU each run's client processes take the GPU share that
    :func:`client_resources` sized for ``parallel`` runs at once, and shared they would be
    one run's count for all of them; runs that differ in a process-wide setting
    (``cuda-deterministic``) would end each other's kept client processes mid-round."""
    if parallel == 1:
        return True
    return resources.num_gpus == 0 and len({process_wide_settings(run.config) for run in runs}) == 1


def execute_sweep(
    sweep: Sweep, out_dir: Path, *, retry_failed: bool = False, progress: bool = True, ray_address: str | None = None,
    parallel: int | None = 1, mps: bool = False,
) -> tuple[int, pd.DataFrame]:
    """Check everything the runs need (data, machine, trackers, MPS) before any Flower or
    Ray process starts (DataUnavailable, ConfigError …), then run the sweep's unfinished
    runs into ``out_dir``. Returns the exit code (1: a run failed) and the results table.
    Interrupted: the tables are written, the message says how to resume, and the
    KeyboardInterrupt propagates. ``parallel`` None: ``--parallel auto``."""
    data = {run.run_id: data_problem_of(run.config) for run in sweep.runs}
    missing = [run for run, problem in data.items() if problem]
    if missing:
        raise DataUnavailable(f"{len(missing)} of {len(sweep.runs)} runs cannot load their data, e.g. run "
                              f"{missing[0]}: {data[missing[0]]}")
    parallel = parallel or auto_parallel(sweep)
    if sweep.gpus_auto:
        sweep = dataclasses.replace(sweep, resources=client_resources(
            [run.config for run in sweep.runs], sweep.resources.num_cpus, None, parallel, ray_address))
    check_machine((run.config for run in sweep.runs), sweep.resources, ray_address)
    check_trackers(run.config for run in sweep.runs)
    check_mps(mps)

    # A sweep with nothing left to run starts no Ray cluster.
    todo = pending_runs(sweep, out_dir, retry_failed)
    shared_ray = ray_address is None and bool(todo) and shares_one_ray_cluster(sweep.resources, todo, parallel)
    with OutputLock(create_output_dir(out_dir)), MpsDaemon(mps) as mps_daemon, \
            LocalRayCluster(shared_ray, machine_cpus(), log_path=out_dir / "ray-cluster.log") as job_ray:
        if mps_daemon.message:
            log.warning(mps_daemon.message)
        try:
            table = run_sweep(sweep, out_dir, retry_failed, progress, ray_address or job_ray, parallel)
        except KeyboardInterrupt:
            table = write_tables(sweep, out_dir)
            completed, failed = int(table["status"].eq("completed").sum()), int(table["status"].eq("failed").sum())
            log.warning(f"interrupted: {completed} of {len(table)} runs completed, {failed} failed, "
                        f"{len(table) - completed - failed} not finished; run the same command again to resume",
                        extra={"bare": True})
            raise
    return (1 if table["status"].eq("failed").any() else 0), table
