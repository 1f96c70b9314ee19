"""Run Basin jobs as real Flower simulations.

    .venv/bin/python -m experiments.run                       # the main job (see below)
    .venv/bin/python -m experiments.run --preset ima-fmnist-shards --set num-rounds=50
    .venv/bin/python -m experiments.run --preset ima-fmnist-dir0.1 \\
        --compare strategy=fedavg,fedprox,fedadam,fedyogi --compare averaging=none,ima
    .venv/bin/python -m experiments.run --ray-address 10.0.0.5:6379   # clients on an existing Ray cluster
    .venv/bin/python -m experiments.run --check-reproducible runs/a runs/b   # the same bits? (exit 0) where not? (exit 1)

Without arguments, the main job: FedAvg, FedAvg+IMA and FedAvg+WIMA on the embedded
digits. Each ``--compare KEY=V1,V2`` multiplies the runs (grid). Prints a summary table
and writes ``accuracy.png`` (all runs in one figure) and ``summary.csv``.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path

from experiments.api import grid
from experiments.runtime.cli import (
    EXIT_INTERRUPTED,
    UsageError,
    add_verbosity_options,
    apply_verbosity,
    exit_command,
    gpu_share,
    guarded,
    nonempty_path,
)
from experiments.runtime.job_folders import label_of as label_of  # the --compare grid's run labels and the job folder's name,
from experiments.runtime.job_folders import output_name as output_name  # as this command line names them

# Only the standard library above (experiments.runtime.cli and experiments.api import nothing else
# at import time): `--help` answers without importing torch or Flower (the rest is imported
# in main, once the arguments are parsed).

def compare_of(specs: list[str]) -> dict[str, list]:
    """``--compare KEY=V1,V2`` flags as {key: [values]} (values in TOML syntax)."""
    from experiments.runtime.run_config import parse_overrides

    compare: dict[str, list] = {}
    for spec in specs:
        key, sep, values = spec.partition("=")
        if not sep or not values:
            raise ValueError(f"--compare {spec!r} is not of the form KEY=V1,V2,...")
        compare[key] = [parse_overrides([f"{key}={v}"])[key] for v in values.split(",")]
    return compare


def variants(compare: list[str]) -> list[dict]:
    """The grid of overrides named by ``--compare KEY=V1,V2`` flags."""
    return grid(compare_of(compare))


def list_presets() -> str:
    """Each preset's name and the first sentence of its description (its leading comment), and
    below it, indented, its estimated wall time (experiments/estimates.py)."""
    from experiments.reproduction.estimates import estimate, step_costs
    from experiments.runtime.run_config import PRESETS_DIR, load_preset, resolve_config

    costs = step_costs()
    lines = []
    for path in sorted(PRESETS_DIR.glob("*.toml")):
        comment = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            comment.append(line.lstrip("# ").strip())
        text = " ".join(part for part in comment if part)
        sentence = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
        lines.append(f"{path.stem:32s} {sentence}")
        lines.append(f"{'':32s} {estimate(resolve_config(load_preset(path.stem), {}), costs).text()}")
    return "\n".join(lines)


def list_keys() -> str:
    """Every run-config key with its default and what it allows."""
    from clients.model_plugins import BROKEN_MODELS
    from experiments.runtime.run_config import default_run_config
    from strategies.config import SCHEMA
    from strategies.methods.registry import BROKEN_PLUGINS

    defaults = default_run_config()
    lines = [f"{key:26s} default {defaults[key]!r:12s} {option.allowed}" for key, option in SCHEMA.items()]
    broken = [*BROKEN_PLUGINS.values(), *BROKEN_MODELS.values()]
    return "\n".join([*lines, *(f"error: {plugin.line()}" for plugin in broken)])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", help="a preset name from experiments/presets/ or a TOML file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a run-config key")
    parser.add_argument("--track", metavar="TRACKERS",
                        help="log every run to experiment trackers: a comma-separated list of tensorboard, mlflow, "
                             "wandb (the run-config key 'track'; needs the optional extra: pip install -e \".[tracking]\")")
    parser.add_argument("--compare", action="append", default=None, metavar="KEY=V1,V2",
                        help="run once per value (several flags: every combination)")
    parser.add_argument("--out", type=nonempty_path, help="output directory (default runs/<preset>-<time>)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results of a run with another config in --out (without it: refused, naming the keys)")
    parser.add_argument("--cpus-per-client", type=float, default=1.0, help="Ray CPUs per virtual client")
    parser.add_argument("--gpus-per-client", type=gpu_share, default=None, metavar="FRACTION|auto",
                        help="Ray GPU fraction per virtual client, e.g. 0.125 for 8 clients per GPU (default auto: "
                             "on CUDA, a round's whole cohort at once within cores and GPU memory; else 0)")
    parser.add_argument("--mps", action="store_true",
                        help="run the client processes under CUDA MPS (kernels of different processes run concurrently)")
    parser.add_argument("--ray-address", metavar="HOST:PORT",
                        help="run the clients on this existing Ray cluster (the address `ray start --head` prints)")
    parser.add_argument("--check-reproducible", nargs=2, type=Path, metavar=("RUN_A", "RUN_B"),
                        help="compare two finished runs' folders instead: results.csv without its timing columns and "
                             "final_model.pt bit for bit; prints the first round and tensor where they differ "
                             "(exit 0: identical, 1: different)")
    parser.add_argument("--list-presets", action="store_true", help="print the presets and what each runs, then exit")
    parser.add_argument("--list-keys", action="store_true",
                        help="print every run-config key, its default and what it allows, then exit")
    add_verbosity_options(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    apply_verbosity(args)
    if args.list_presets or args.list_keys:
        print(list_presets() if args.list_presets else list_keys())
        return 0
    if args.check_reproducible:
        return guarded(lambda: check_reproducible(*args.check_reproducible))
    return guarded(lambda: run_job(args, sys.argv[1:] if argv is None else argv))


def check_reproducible(a: Path, b: Path) -> int:
    """Print whether two run folders hold the same results and final model (0) or not (1)."""
    from experiments.runtime.reproducible import compare_runs

    try:
        comparison = compare_runs(a, b)
    except FileNotFoundError as error:
        raise UsageError(f"--check-reproducible: {error}") from None
    print(comparison.report(a, b))
    return 0 if comparison.identical else 1


def run_job(args: argparse.Namespace, argv: list[str]) -> int:
    """Run the job (experiments.api.run_job), then print its summary table (see main)."""
    import pandas as pd

    from experiments.api import run_job as run_api_job
    from experiments.runtime.run_config import parse_overrides
    from experiments.runtime.run_endings import RunFailed

    out = args.out
    try:
        job = run_api_job(
            args.preset, parse_overrides(args.set), compare_of(args.compare) if args.compare is not None else None,
            out, track=args.track, overwrite=args.overwrite, cpus_per_client=args.cpus_per_client,
            gpus_per_client=args.gpus_per_client, mps=args.mps, ray_address=args.ray_address,
            resume_hint=lambda out_dir: resume_command(argv, out, out_dir),
        )
        failed = False
    except RunFailed as error:
        if not hasattr(error, "job"):
            raise
        job, failed = error.job, str(error)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finished = job.summary[job.summary["status"] == "completed"].drop(columns="status")
    if len(finished):
        with pd.option_context("display.float_format", "{:.4f}".format, "display.width", 140):
            print(finished.to_string())
        print(f"results: {job.out}\nfigure:  {job.figure}")
    if failed:
        print(f"error: {failed}", file=sys.stderr)
        return 1
    return 0


def resume_command(argv: list[str], out: Path | None, out_dir: Path) -> str:
    """The command that continues an interrupted job: the same one, with ``--out`` when it had none."""
    python = os.path.relpath(sys.executable)
    return shlex.join([python if not python.startswith("..") else sys.executable, "-m", "experiments.run", *argv,
                       *(() if out is not None else ("--out", str(out_dir)))])



if __name__ == "__main__":
    exit_command(main())
