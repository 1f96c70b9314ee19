"""Basin from Python: run, compare, sweep and reproduce from a script or a notebook cell,
with pandas data frames back. The command lines (``experiments.run``, ``.sweep``,
``.reproduce``) are thin wrappers over these functions.

    from experiments.api import run, sweep, reproduce, load_run

    job = run(preset="ima-fmnist-dir0.1", set={"num-rounds": 50},
              compare={"averaging": ["none", "ima"]}, out="runs/nb")
    job.rounds, job.summary, job.figure       # per round, per run, accuracy.png
    s = sweep("ima-fmnist-alpha", set={"num-rounds": 20}, parallel=2)
    s.table, s.curves, s.report()
    load_run("runs/nb")                       # a finished job or run folder, back
    r = reproduce("fedalign-table5")          # a paper table: r.report, r.headline, r.files

``run()`` with no ``preset``, ``set`` and ``compare`` is the README's main job. Errors are
exceptions with the command lines' one-line messages, raised before Flower or Ray start
(never ``SystemExit``): ``ValueError`` and its subclasses for bad input,
``FileNotFoundError``, ``CheckpointError``, ``RayClusterUnreachable``, ``DiskFull``,
``RunFailed`` (after the job's other runs; ``error.job`` holds what finished) and
``KeyboardInterrupt`` (the runs stopped, the folder resumable by the same call): each in
docs/python-api.md. Progress: bars in a terminal, a widget in a notebook, whole lines in
a log file; Basin's own lines through the ``basin`` logger.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clients.log import log
from experiments.job_results import Job, SweepResult, load_run, read_json
from experiments.runtime.job_folders import check_distinct_labels, job_output_dir, label_of, output_name

__all__ = ["Job", "SweepResult", "load_run", "reproduce", "run", "sweep"]

if TYPE_CHECKING:
    import pandas as pd

    from experiments.reproduction.runner import Reproduction

# The main job's comparison: FedAvg without and with each averaging rule.
MAIN_JOB_COMPARE = {"averaging": ["none", "ima", "wima"]}


def grid(compare: Mapping[str, Sequence[Any]] | None) -> list[dict[str, Any]]:
    """Every combination of the compared values, as run-config overrides."""
    import itertools

    from experiments.runtime.cli import UsageError

    axes = []
    for key, values in (compare or {}).items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise UsageError(f"compare[{key!r}] = {values!r} is not allowed; allowed: a non-empty list of values")
        axes.append([(key, value) for value in values])
    return [dict(point) for point in itertools.product(*axes)]


def run(
    preset: str | None = None,
    *,
    set: Mapping[str, Any] | None = None,  # noqa: A002 - the command line's --set
    compare: Mapping[str, Sequence[Any]] | None = None,
    out: str | Path | None = None,
    track: str | None = None,
    overwrite: bool = False,
    cpus_per_client: float = 1.0,
    gpus_per_client: float | None = None,
    mps: bool = False,
    ray_address: str | None = None,
    progress: bool = True,
) -> Job:
    """Run a job of real Flower simulations and return it: ``.venv/bin/python -m experiments.run``.

    Args:
        preset: a preset name (``.venv/bin/python -m experiments.run --list-presets``) or a TOML file.
        set: run-config overrides for every run, e.g. ``{"num-rounds": 50}`` (``--set``).
        compare: run once per value, every combination of the keys, e.g.
            ``{"strategy": ["fedavg", "fedprox"], "averaging": ["none", "ima"]}`` (``--compare``).
        out: the job's folder (``--out``; default a new ``runs/<name>-<time>``). Give it to
            resume an interrupted job by the same call.
        track: trackers, a comma-separated list of tensorboard, mlflow, wandb (``--track``).
        overwrite: replace results of another config in ``out`` (``--overwrite``).
        cpus_per_client, gpus_per_client: Ray resources per virtual client (None: auto).
        mps: run the client processes under CUDA MPS (``--mps``).
        ray_address: run the clients on this existing Ray cluster (``--ray-address``).
        progress: draw progress (a widget in a notebook).

    Returns:
        The :class:`Job`: ``rounds``, ``summary``, ``figure``, ``runs``, ``configs``.

    Raises:
        See the module docstring; ``RunFailed`` after the other runs when a run failed.
    """
    return run_job(preset, set or {}, compare, out, track=track, overwrite=overwrite,
                   cpus_per_client=cpus_per_client, gpus_per_client=gpus_per_client, mps=mps,
                   ray_address=ray_address, progress=progress)


def run_job(
    preset: str | None, overrides: Mapping[str, Any], compare: Mapping[str, Sequence[Any]] | None,
    out: str | Path | None, *, track: str | None = None, overwrite: bool = False, cpus_per_client: float = 1.0,
    gpus_per_client: float | None = None, mps: bool = False, ray_address: str | None = None, progress: bool = True,
    resume_hint: Callable[[Path], str] | None = None,
) -> Job:
    """:func:`run`'s implementation (the command line gives ``resume_hint``: the command
    that resumes an interrupted job in a folder)."""

    from experiments.runtime.finished_runs import averaging_start, method_label, plot_accuracy, setup_title, summary_table
    from experiments.runtime.flower_log import count_rounds
    from experiments.runtime.launch import launch
    from experiments.runtime.machine import check_data, check_machine, check_trackers, client_resources, machine_cpus
    from experiments.runtime.mps import MpsDaemon, check_mps
    from experiments.runtime.output_dir import OutputLock
    from experiments.runtime.ray_cluster import LocalRayCluster, check_ray_address
    from experiments.runtime.run_config import load_preset, resolve_config, tracked_in
    from experiments.runtime.run_endings import RunFailed, check_folder_reuse
    from strategies.checkpoint import read_checkpoint

    main_job = compare is None and not (preset or overrides)
    if main_job:
        compare = MAIN_JOB_COMPARE
    points = grid(compare)
    # Everything that can be known before Flower starts is checked here, in this order.
    base = load_preset(preset) if preset else {}
    overrides = {**overrides, **({"track": track} if track is not None else {})}
    runs = {label_of(point): resolve_config(base, overrides, point) for point in points}
    check_distinct_labels(points, runs, compare)
    check_data(runs.values())
    check_trackers(runs.values())
    resources = client_resources(runs.values(), cpus_per_client, gpus_per_client, ray_address=ray_address)
    check_machine(runs.values(), resources, ray_address)
    check_mps(mps)
    if ray_address is not None:
        check_ray_address(ray_address)

    compared = list(compare or {}) if len(runs) > 1 else []
    name = output_name(preset, main_job, next(iter(runs.values())), compared)
    out_dir = job_output_dir(Path(out) if out is not None else None, list(runs.values()), name)
    run_dirs = {label: out_dir / label if len(runs) > 1 else out_dir for label in runs}
    runs = {label: tracked_in(config, out_dir, name) for label, config in runs.items()}  # a job's runs: one group
    # Runs are named by what ran ("FedAvg+IMA"), plus any other compared key, in the
    # progress bars, the figure and the table; their folders by the compared values.
    extra = [key for key in compare or {} if key not in ("strategy", "averaging")]
    names = {label: method_label(config, extra) for label, config in runs.items()}
    job = Job(out_dir, {names[label]: run_dirs[label] for label in runs})
    finished, failed = [], []
    # Several runs one after another share one Ray cluster (started inside MPS, if asked).
    shared_ray = ray_address is None and len(runs) > 1
    with OutputLock(out_dir), MpsDaemon(mps) as mps_daemon, LocalRayCluster(
            shared_ray, machine_cpus(), log_path=out_dir / "ray-cluster.log") as job_ray:
        if mps_daemon.message:
            log.warning(mps_daemon.message)
        for label, config in runs.items():  # another config's results or checkpoint stop the job before any run
            check_folder_reuse(run_dirs[label], config, overwrite)  # with overwrite: removed
            read_checkpoint(run_dirs[label], {**config, "output-dir": str(run_dirs[label])})
        for label, config in runs.items():
            try:
                launch(config, run_dirs[label], resources, progress=progress, ray_address=ray_address or job_ray,
                       overwrite=overwrite, label=f"{names[label]} ({len(finished) + len(failed) + 1}/{len(runs)})")
                finished.append(label)
            except RunFailed as error:
                log.error(f"error: {error}", extra={"bare": True})
                failed.append(label)
            except KeyboardInterrupt:
                hint = resume_hint(out_dir) if resume_hint else f"the same call with out={str(out_dir)!r}"
                log.warning(f"interrupted {names[label]} after round {count_rounds(run_dirs[label])}; resume with: {hint}",
                            extra={"bare": True})
                raise

    if finished:
        import pandas as pd

        plot_accuracy(
            {names[label]: pd.read_csv(run_dirs[label] / "results.csv") for label in finished}, out_dir / "accuracy.png",
            title=f"{name}: {setup_title(next(iter(runs.values())))}",
            starts={names[label]: averaging_start(runs[label]) for label in finished},
        )
        summary_table({names[label]: read_json(run_dirs[label] / "summary.json") for label in finished}).to_csv(
            out_dir / "summary.csv")
    if failed:
        error = RunFailed(f"{len(failed)} of {len(runs)} runs failed: {', '.join(names[label] for label in failed)} "
                          f"(their folders, with flwr.log, are kept in {out_dir})")
        error.job = job
        raise error
    return job


def sweep(
    name_or_path: str,
    *,
    set: Mapping[str, Any] | None = None,  # noqa: A002 - the command line's --set
    out: str | Path | None = None,
    parallel: int | None = 1,
    retry_failed: bool = False,
    track: str | None = None,
    mps: bool = False,
    ray_address: str | None = None,
    progress: bool = True,
) -> SweepResult:
    """Run a sweep's unfinished runs (resumable) and return it: ``.venv/bin/python -m experiments.sweep``.

    Args:
        name_or_path: a sweep from experiments/sweep_files/ or a TOML file.
        set: run-config overrides for every run (``--set``).
        out: the sweep's folder (default ``runs/<sweep name>``).
        parallel: runs at once (``--parallel``; None: auto).
        retry_failed: run failed runs again. track, mps, ray_address: as :func:`run`.

    Raises:
        See the module docstring; ``RunFailed`` when a run failed (the others ran).
    """
    from experiments.runtime.run_endings import RunFailed
    from experiments.runtime.sweep_definition import load_sweep, sweep_path
    from experiments.runtime.sweep_runs import execute_sweep

    _check_parallel(parallel)
    loaded = load_sweep(sweep_path(name_or_path), {**(set or {}), **({"track": track} if track is not None else {})})
    out_dir = (Path(out) if out is not None else Path("runs") / loaded.name).resolve()
    result = SweepResult(out_dir, loaded.name, {r.run_id: out_dir / "runs" / r.run_id for r in loaded.runs})
    code, table = execute_sweep(loaded, out_dir, retry_failed=retry_failed, progress=progress,
                                ray_address=ray_address, parallel=parallel, mps=mps)
    if code:
        failed = table[table["status"] == "failed"]
        error = RunFailed(f"{len(failed)} of {len(table)} runs of sweep {loaded.name} failed, e.g. "
                          f"{failed['run'].iloc[0]}: {failed['error'].iloc[0]}")
        error.job = result
        raise error
    return result


def reproduce(
    table: str,
    *,
    only: Sequence[str] = (),
    seeds: int | None = None,
    set: Mapping[str, Any] | None = None,  # noqa: A002 - the command line's --set
    out: str | Path | None = None,
    parallel: int | None = 1,
    mps: bool = False,
    ray_address: str | None = None,
    retry_failed: bool = False,
    report_only: bool = False,
    dry_run: bool = False,
    progress: bool = True,
) -> Reproduction | pd.DataFrame:
    """Reproduce a paper's table and return its report: ``.venv/bin/python -m experiments.reproduce``.

    Args:
        table: a table name (``.venv/bin/python -m experiments.reproduce --list``) or a paper-table TOML file.
        only: keep the cells whose row or column is one of these comma-separated names, each
            entry a filter, all of them intersected (``--only``), e.g. ``["FMNIST", "FedAvg,FedProx"]``.
        seeds: seeds per cell, 0 … seeds − 1 (default: the table's).
        set: run-config overrides for every run (``--set``).
        out: the folder (default ``runs/reproduce/<table>``); finished runs in it are reused.
        parallel: runs at once (``--parallel``; None: auto). mps, ray_address, retry_failed:
            as the command line's options.
        report_only: report what earlier calls ran; start no run.
        dry_run: run nothing; return one row per cell: the paper's value, its status, the
            run it needs and its client steps (no step timing).
        progress: draw progress.

    Returns:
        A :class:`~experiments.reproduction.runner.Reproduction`: ``report`` (a DataFrame,
        one row per cell: paper, basin, difference, verdict, gains, note), ``headline``,
        ``files`` (report.md, report.csv, report.png) and ``out``; with ``dry_run`` the
        cells' DataFrame.

    Raises:
        As :func:`run`: ``ValueError`` and its subclasses for bad input (``TableError`` for
        a table or an ``only`` that matches nothing) before anything starts;
        ``KeyboardInterrupt`` once the running runs are stopped (the same call resumes);
        ``RunFailed`` when a run failed, after the others ran and the report was written
        (``error.job`` holds the Reproduction).
    """
    from experiments.reproduction.runner import dry_run_cells, reproduce_table
    from experiments.runtime.cli import UsageError
    from experiments.runtime.run_endings import RunFailed

    if seeds is not None and (isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1):
        raise UsageError(f"seeds = {seeds!r} is not allowed; allowed: an integer >= 1")
    _check_parallel(parallel)
    if isinstance(only, str):
        raise UsageError(f"only = {only!r} is not allowed; allowed: a list of filters, e.g. [{only!r}]")
    if dry_run:
        return dry_run_cells(table, only, seeds, set, timing=False)[1]
    done = reproduce_table(table, only, seeds, set, Path(out) if out is not None else None, parallel, mps,
                           ray_address, retry_failed, report_only, progress)
    if done.failed:
        error = RunFailed(f"{len(done.failed)} runs of {done.table.name} failed, e.g. {done.failed[0]} "
                          f"(the report says why per cell: {done.files[0]})")
        error.job = done
        raise error
    return done


def _check_parallel(parallel: int | None) -> None:
    """``parallel`` of sweep() and reproduce(): runs at once, or None (auto)."""
    from experiments.runtime.cli import UsageError

    if parallel is not None and (isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1):
        raise UsageError(f"parallel = {parallel!r} is not allowed; allowed: an integer >= 1 or None (auto)")


