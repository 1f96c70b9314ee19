"""Sweeps: many Basin runs over a grid of configs, resumable, one results table.

    .venv/bin/python -m experiments.sweep ima-fmnist-alpha            # a sweep from experiments/sweep_files/
    .venv/bin/python -m experiments.sweep my-sweep.toml --set num-rounds=20 --out runs/quick
    .venv/bin/python -m experiments.sweep my-sweep.toml --list        # the runs and their status
    .venv/bin/python -m experiments.sweep ima-fmnist-alpha --ray-address 10.0.0.5:6379  # on a Ray cluster

A sweep file (TOML; every field: docs/sweeps.md)::

    preset = "ima-fmnist-dir0.1"     # optional base preset; name = "…" names the output folder
    [set]                            # run-config overrides for every run
    num-rounds = 300
    [grid]                           # every combination of these axes, in this order
    alpha = [0.05, 0.1, 0.3]
    method = [{strategy = "fedavg"}, {strategy = "fedprox", prox-mu = 0.01}]

An axis is a run-config key with a list of values, or any name with a list of tables
of keys that change together. Grid points that resolve to the same config run once.
Everything is validated before the first run starts.

Each run is a real Flower run in ``<out>/runs/<run id>``, resumable; after every run the
tables (``results.parquet``/``.csv``, ``curves.parquet``) are rebuilt atomically, and
``report/`` holds the tables and figures (``experiments.sweep_report``).

In detail: docs/sweeps.md.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd

from experiments.runtime.cli import add_verbosity_options, apply_verbosity, exit_command, guarded, nonempty_path, parallel_runs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", help="a sweep name from experiments/sweep_files/ or a TOML file")
    parser.add_argument("--track", metavar="TRACKERS",
                        help="log every run to experiment trackers: a comma-separated list of tensorboard, mlflow, "
                             "wandb (the run-config key track, as a sweep file's [set] track = ...; grouped by sweep)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a run-config key in every run (changes the runs' configs)")
    parser.add_argument("--out", type=nonempty_path, help="output directory (default runs/<sweep name>)")
    parser.add_argument("--retry-failed", action="store_true", help="run failed runs again")
    parser.add_argument("--list", action="store_true", help="print the runs and their status; run nothing")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--parallel", type=parallel_runs, default=1, metavar="N|auto",
                        help="run N runs at once, each its own Flower run (default 1; results do not depend on it); "
                             "auto: 1 on CPU, on a GPU up to 4 as its free memory allows")
    parser.add_argument("--mps", action="store_true",
                        help="run the client processes under CUDA MPS (kernels of different processes run concurrently)")
    parser.add_argument("--ray-address", metavar="HOST:PORT",
                        help="run the clients on this existing Ray cluster (the address `ray start --head` prints)")
    add_verbosity_options(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    apply_verbosity(args)
    return guarded(lambda: run_command(args))


def run_command(args: argparse.Namespace) -> int:
    """Validate the sweep, then list it or run it (see main)."""
    # The implementation imports torch and Flower: only once the arguments parsed.
    from pathlib import Path

    from experiments.runtime.cli import EXIT_INTERRUPTED
    from experiments.runtime.machine import data_problem_of
    from experiments.runtime.ray_cluster import check_ray_address
    from experiments.runtime.run_config import parse_overrides
    from experiments.runtime.sweep_definition import load_sweep, sweep_path
    from experiments.runtime.sweep_runs import collect, execute_sweep

    overrides = {**parse_overrides(args.set), **({"track": args.track} if args.track is not None else {})}
    sweep = load_sweep(sweep_path(args.sweep), overrides)
    if args.ray_address is not None and not args.list:
        check_ray_address(args.ray_address)
    out_dir = (args.out or Path("runs") / sweep.name).resolve()
    note = f" ({sweep.duplicates} grid points repeat another's config and run once)" if sweep.duplicates else ""
    print(f"sweep {sweep.name}: {len(sweep.runs)} runs{note} → {out_dir}")
    if args.list:
        # Runs whose data cannot be loaded here are marked (a real run refuses them before anything starts).
        data = {run.run_id: data_problem_of(run.config) for run in sweep.runs}
        table, _ = collect(sweep, out_dir)
        table["data"] = ["ok" if data[run] is None else "unavailable" for run in table["run"]]
        from experiments.reproduction.estimates import estimate, step_costs

        costs = step_costs()
        estimates = {run.run_id: estimate(run.config, costs) for run in sweep.runs}
        table["estimate"] = [estimates[run].text() for run in table["run"]]
        print(table[["run", "status", "data", "acc-last-k", "estimate", "error"]].to_string(index=False))
        known = [e.cpu_seconds for e in estimates.values() if e.cpu_seconds is not None]
        if known:
            from experiments.reproduction.estimates import duration

            print(f"all {len(known)} estimated runs: ≈ {duration(sum(known))} on 2 CPU cores one run at a time "
                  f"(FedAvg's measured step of each model; experiments/reproduction/estimates.py)")
        for problem in dict.fromkeys(p for p in data.values() if p):
            print(f"data unavailable: {problem}", file=sys.stderr)
        return 0
    try:
        code, table = execute_sweep(sweep, out_dir, retry_failed=args.retry_failed, progress=not args.no_progress,
                                    ray_address=args.ray_address, parallel=args.parallel, mps=args.mps)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    _print_outcome(table, out_dir)
    return code


def _print_outcome(table: pd.DataFrame, out_dir: Path) -> None:
    from experiments.sweep_report import write_report

    counts = table["status"].value_counts().to_dict()
    print("runs: " + ", ".join(f"{n} {status}" for status, n in counts.items()))
    for _, row in table[table["status"] == "failed"].iterrows():
        print(f"failed: {row['run']}: {row['error']}", file=sys.stderr)
    if counts.get("completed"):
        files = write_report(out_dir)
        print(f"results: {out_dir / 'results.parquet'} (and .csv), curves: {out_dir / 'curves.parquet'}")
        print(f"report: {len(files)} files in {out_dir / 'report'}")



if __name__ == "__main__":
    exit_command(main())
