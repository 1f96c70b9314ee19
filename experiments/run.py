"""Run Basin jobs as real Flower simulations.

    python -m experiments.run                       # the main job (see below)
    python -m experiments.run --preset ima-fmnist-shards --set num-rounds=50
    python -m experiments.run --preset ima-fmnist-dir0.1 \\
        --compare strategy=fedavg,fedprox,fedadam,fedyogi --compare averaging=none,ima
    python -m experiments.run --ray-address 10.0.0.5:6379   # clients on an existing Ray cluster
    python -m experiments.run --check-reproducible runs/a runs/b   # the same bits? (exit 0) where not? (exit 1)

Without arguments, the main job: FedAvg, FedAvg+IMA and FedAvg+WIMA on the embedded
digits. Each ``--compare KEY=V1,V2`` multiplies the runs (grid). Prints a summary table
and writes ``accuracy.png`` (all runs in one figure) and ``summary.csv``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shlex
import sys
from pathlib import Path

from experiments.cli import EXIT_INTERRUPTED, UsageError, gpu_share, guarded, nonempty_path

# Only the standard library above (experiments.cli uses nothing else): `--help` answers
# without importing torch or Flower (the rest is imported in main, once the arguments are parsed).

MAIN_JOB_COMPARE = ["averaging=none,ima,wima"]


def variants(compare: list[str]) -> list[dict]:
    """The grid of overrides named by ``--compare KEY=V1,V2`` flags."""
    from experiments.run_config import parse_overrides

    axes = []
    for spec in compare:
        key, sep, values = spec.partition("=")
        if not sep or not values:
            raise ValueError(f"--compare {spec!r} is not of the form KEY=V1,V2,...")
        axes.append([parse_overrides([f"{key}={v}"]) for v in values.split(",")])
    return [dict(kv for part in combo for kv in part.items()) for combo in itertools.product(*axes)]


def label_of(overrides: dict) -> str:
    return "-".join(f"{v}" for v in overrides.values()) or "run"


def list_presets() -> str:
    """Each preset's name and the first sentence of its description (its leading comment)."""
    from experiments.run_config import PRESETS_DIR

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
    return "\n".join(lines)


def list_keys() -> str:
    """Every run-config key with its default and what it allows."""
    from experiments.run_config import default_run_config
    from strategies.config import SCHEMA

    defaults = default_run_config()
    return "\n".join(f"{key:26s} default {defaults[key]!r:12s} {option.allowed}" for key, option in SCHEMA.items())


def output_name(preset: str | None, main_job: bool, config: dict, compared: list[str] = ()) -> str:
    """The output folder's name: the preset, "main" for the main job, the compared keys
    ("compare-strategy") for a comparison without a preset, else what ran."""
    if preset:  # a name ("ima-fmnist-dir0.1", whose ".1" is not a suffix) or a TOML path
        return Path(preset).stem if preset.endswith(".toml") else Path(preset).name
    if main_job:
        return "main"
    if compared:  # not the first run's method: the comparison's
        return "compare-" + "-".join(dict.fromkeys(spec.partition("=")[0] for spec in compared))
    from experiments.report import method_label

    return re.sub(r"[^A-Za-z0-9.+=-]+", "-", method_label(config).lower()).strip("-")


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
    return parser


def output_dir_of(out: Path | None, configs: list[dict], name: str) -> Path:
    """The job's output folder, created: ``--out``, else the configs' ``output-dir``, else a
    new ``runs/<name>-<time>``; ``--out`` and an ``output-dir`` naming another folder are refused."""
    from experiments.output_dir import create_output_dir, unique_output_dir

    requested = sorted({config["output-dir"] for config in configs} - {""})
    if len(requested) > 1:
        raise UsageError(f"run config key 'output-dir' takes {len(requested)} values {requested}; allowed: one folder")
    if requested and out is not None and Path(requested[0]).expanduser().resolve() != out.expanduser().resolve():
        raise UsageError(
            f"run config key 'output-dir' = {requested[0]!r} and --out {out} name different folders; "
            f"allowed: one of them (or both naming the same folder)"
        )
    if out is None and requested:
        return create_output_dir(Path(requested[0]), "run config key 'output-dir' =")
    return create_output_dir(out) if out is not None else unique_output_dir(Path("runs"), name)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list_presets or args.list_keys:
        print(list_presets() if args.list_presets else list_keys())
        return 0
    if args.check_reproducible:
        return guarded(lambda: check_reproducible(*args.check_reproducible))
    return guarded(lambda: run_job(args, sys.argv[1:] if argv is None else argv))


def check_reproducible(a: Path, b: Path) -> int:
    """Print whether two run folders hold the same results and final model (0) or not (1)."""
    from experiments.reproducible import compare_runs

    try:
        comparison = compare_runs(a, b)
    except FileNotFoundError as error:
        raise UsageError(f"--check-reproducible: {error}") from None
    print(comparison.report(a, b))
    return 0 if comparison.identical else 1


def run_job(args: argparse.Namespace, argv: list[str]) -> int:
    """Validate everything, then run the job's simulations one after another (see main)."""
    main_job = args.compare is None and not (args.preset or args.set)
    compare = args.compare if args.compare is not None else (MAIN_JOB_COMPARE if main_job else [])

    import pandas as pd

    from experiments.flower_log import count_rounds
    from experiments.launch import RunFailed, check_folder_reuse, launch
    from experiments.machine import check_data, check_machine, check_trackers, client_resources, machine_cpus
    from experiments.mps import MpsDaemon, check_mps
    from experiments.output_dir import OutputLock
    from experiments.ray_cluster import LocalRayCluster, check_ray_address
    from experiments.report import averaging_start, method_label, plot_accuracy, setup_title, summary_table
    from experiments.run_config import load_preset, parse_overrides, resolve_config, tracked_in
    from strategies.checkpoint import read_checkpoint

    # Everything that can be known before Flower starts is checked here, in this order.
    preset = load_preset(args.preset) if args.preset else {}
    overrides = {**parse_overrides(args.set), **({"track": args.track} if args.track is not None else {})}
    runs = {label_of(v): resolve_config(preset, overrides, v) for v in variants(compare)}
    check_data(runs.values())
    check_trackers(runs.values())
    resources = client_resources(runs.values(), args.cpus_per_client, args.gpus_per_client, ray_address=args.ray_address)
    check_machine(runs.values(), resources, args.ray_address)
    check_mps(args.mps)
    if args.ray_address is not None:
        check_ray_address(args.ray_address)

    name = output_name(args.preset, main_job, next(iter(runs.values())), compare if len(runs) > 1 else [])
    out_dir = output_dir_of(args.out, list(runs.values()), name)
    run_dirs = {label: out_dir / label if len(runs) > 1 else out_dir for label in runs}
    runs = {label: tracked_in(config, out_dir, name) for label, config in runs.items()}  # a job's runs: one group
    # Runs are named by what ran ("FedAvg+IMA"), plus any other compared key, in the
    # progress bars, the figure and the table; their folders by the compared values.
    extra = [k for k in dict.fromkeys(k for v in variants(compare) for k in v) if k not in ("strategy", "averaging")]
    names = {label: method_label(config, extra) for label, config in runs.items()}
    summaries, curves, failed = {}, {}, []
    # Several runs one after another share one Ray cluster (started inside MPS, if asked).
    shared_ray = args.ray_address is None and len(runs) > 1
    with OutputLock(out_dir), MpsDaemon(args.mps) as mps, LocalRayCluster(shared_ray, machine_cpus()) as job_ray:
        if mps.message:
            print(f"[basin] {mps.message}", file=sys.stderr)
        ray_address = args.ray_address or job_ray
        for label, config in runs.items():  # another config's results or checkpoint stop the job before any run
            check_folder_reuse(run_dirs[label], config, args.overwrite)  # with --overwrite: removed
            read_checkpoint(run_dirs[label], {**config, "output-dir": str(run_dirs[label])})
        for label, config in runs.items():
            try:
                summaries[label] = launch(config, run_dirs[label], resources, ray_address=ray_address, overwrite=args.overwrite,
                                          label=f"{names[label]} ({len(summaries) + len(failed) + 1}/{len(runs)})")
                curves[label] = pd.read_csv(run_dirs[label] / "results.csv")
            except RunFailed as error:
                print(f"error: {error}", file=sys.stderr)
                failed.append(label)
            except KeyboardInterrupt:
                print(f"interrupted {names[label]} after round {count_rounds(run_dirs[label])}; resume with: "
                      f"{resume_command(argv, args.out, out_dir)}", file=sys.stderr)
                return EXIT_INTERRUPTED

    if summaries:
        figure = plot_accuracy(
            {names[label]: frame for label, frame in curves.items()}, out_dir / "accuracy.png",
            title=f"{name}: {setup_title(next(iter(runs.values())))}",
            starts={names[label]: averaging_start(runs[label]) for label in curves},
        )
        table = summary_table({names[label]: summary for label, summary in summaries.items()})
        table.to_csv(out_dir / "summary.csv")
        with pd.option_context("display.float_format", "{:.4f}".format, "display.width", 140):
            print(table.to_string())
        print(f"results: {out_dir}\nfigure:  {figure}")
    if failed:
        print(f"error: {len(failed)} of {len(runs)} runs failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def resume_command(argv: list[str], out: Path | None, out_dir: Path) -> str:
    """The command that continues an interrupted job: the same one, with ``--out`` when it had none."""
    python = os.path.relpath(sys.executable)
    return shlex.join([python if not python.startswith("..") else sys.executable, "-m", "experiments.run", *argv,
                       *(() if out is not None else ("--out", str(out_dir)))])


if __name__ == "__main__":
    sys.exit(main())
