"""Run Basin jobs: ``python -m experiments.run [--preset NAME] [--set key=value ...]``.

Without arguments: the main job on the embedded digits data set. Prints a summary table
and writes ``accuracy.png`` beside each run's results (see README, "What a run writes").
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from experiments.launch import ClientResources, RunFailed, launch, load_preset, parse_overrides, resolve_config
from experiments.report import plot_accuracy, summary_table
from strategies.config import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", help="a preset name from experiments/presets/ or a TOML file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a run-config key")
    parser.add_argument("--out", type=Path, help="output directory (default runs/<preset>-<time>)")
    parser.add_argument("--cpus-per-client", type=float, default=1.0, help="Ray CPUs per virtual client")
    parser.add_argument("--gpus-per-client", type=float, default=0.0,
                        help="Ray GPU fraction per virtual client, e.g. 0.125 for 8 clients per GPU")
    args = parser.parse_args(argv)

    try:
        preset = load_preset(args.preset) if args.preset else {}
        config = resolve_config(preset, parse_overrides(args.set))
    except (ConfigError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    name = Path(args.preset).stem if args.preset else "main"
    out_dir = args.out or Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        summary = launch(config, out_dir, ClientResources(args.cpus_per_client, args.gpus_per_client), label=name)
    except RunFailed as error:
        print(f"error: {error}", file=sys.stderr)
        return 1

    out_dir = out_dir.resolve()
    curves = {name: pd.read_csv(out_dir / "results.csv")}
    figure = plot_accuracy(curves, out_dir / "accuracy.png", title=f"{name}: {config['strategy']} on {config['dataset']}")
    with pd.option_context("display.float_format", "{:.4f}".format, "display.width", 120):
        print(summary_table({name: summary}).to_string())
    print(f"results: {out_dir}/results.csv\nfigure:  {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
