"""Reproduce a paper's table: Basin's numbers beside every number of the paper's.

    .venv/bin/python -m experiments.reproduce --list                      # every table: cells, runnable here, unsupported
    .venv/bin/python -m experiments.reproduce ima-table1 --dry-run        # each cell, the paper's value, the run, the compute
    .venv/bin/python -m experiments.reproduce ima-table1 --only FMNIST --seeds 3 --parallel auto --mps   # run and report
    .venv/bin/python -m experiments.reproduce fedalign-table5             # the MFLOPs and parameters, on the CPU in minutes

The tables (experiments/paper_tables/<name>.toml) hold every numeric cell of IMA Tables
I–III, WIMA Tables 2–5, FedAlign Tables 1–7 and FedSWA Table 3, each mapped to the Basin
run that reproduces it, or to the reason it cannot run. A run goes through the sweep
machinery into ``<out>/runs`` (default out: runs/reproduce/<table>): resumable, parallel,
on a Ray cluster with --ray-address; finished runs are reused, so a second call only
reports. Each call writes ``report.md``, ``report.csv`` and ``report.png`` (Basin against
the paper with the tolerance band) into the out folder and prints the table: per cell the
paper's value, Basin's mean ± std over seeds, the difference and a verdict; for a
without/with pair (IMA, WIMA) both gains and a gain verdict; and a headline (cells matched /
run / total). The tolerances and verdicts: docs/reproducing.md.

Cells whose data set is not on this machine are not run (the report says so per cell).
Exit status: 0 when every run that can run here finished (whatever the verdicts), 1 when a
run failed, 2 for a usage error, 130 when interrupted (run the same command again to
resume).
"""

from __future__ import annotations

import argparse

from experiments.runtime.cli import add_verbosity_options, apply_verbosity, exit_command, guarded, nonempty_path, parallel_runs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m experiments.reproduce", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", nargs="?", help="a table name (see --list) or a paper-table TOML file")
    parser.add_argument("--list", action="store_true", help="list every table with its counts of cells; run nothing")
    parser.add_argument("--dry-run", action="store_true",
                        help="print each cell, the paper's value, the run it needs and the compute estimate; run nothing")
    parser.add_argument("--no-timing", action="store_true",
                        help="with --dry-run: count client steps only (do not time a step of each model here)")
    parser.add_argument("--only", action="append", default=[], metavar="ROWS/COLUMNS",
                        help="keep the cells whose row or column is one of these comma-separated names (a column "
                             "also matches a part of its name, e.g. FMNIST); repeat to intersect, e.g. "
                             "--only FMNIST --only FedAvg,FedProx")
    parser.add_argument("--seeds", type=int, metavar="N", help="seeds per cell, 0 … N−1 (default: the table's, 3 mostly)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a run-config key in every run (the report then says it is not the paper's setup)")
    parser.add_argument("--out", type=nonempty_path, help="output folder (default runs/reproduce/<table>)")
    parser.add_argument("--parallel", type=parallel_runs, default=1, metavar="N|auto",
                        help="run N runs at once (default 1; auto: 1 on CPU, on a GPU up to 4)")
    parser.add_argument("--mps", action="store_true", help="run the client processes under CUDA MPS")
    parser.add_argument("--ray-address", metavar="HOST:PORT", help="run the clients on this existing Ray cluster")
    parser.add_argument("--retry-failed", action="store_true", help="run failed runs again")
    parser.add_argument("--report-only", action="store_true", help="report the runs finished so far; start none")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_verbosity_options(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    apply_verbosity(args)
    if not args.list and not args.table:
        parser.error("give a TABLE (see --list) or --list")
    if args.seeds is not None and args.seeds < 1:
        parser.error(f"--seeds: {args.seeds} is not allowed; allowed: an integer >= 1")
    # The implementation imports torch and Flower: only once the arguments parsed.
    from experiments.reproduction.runner import run_command

    return guarded(lambda: run_command(args))


if __name__ == "__main__":
    exit_command(main())
