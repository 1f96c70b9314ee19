"""Run Basin on Flower's Deployment Engine on this machine.

    .venv/bin/python -m experiments.deploy --set num-rounds=5            # insecure
    .venv/bin/python -m experiments.deploy --tls --set num-rounds=5      # TLS
    .venv/bin/python -m experiments.deploy --auth --set num-rounds=5     # TLS + SuperNode authentication

A real ``flower-superlink`` and one ``flower-supernode`` per client, each its own process
talking HTTP(S) over localhost as on separate machines, then ``flwr run`` submits the run:
the same cohorts, order and results as the simulation, bit for bit. Everything it starts is
stopped by PID when the run ends; logs go to the output directory.

In detail: docs/command-lines.md (``.venv/bin/python -m experiments.deploy``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from experiments.runtime.cli import add_verbosity_options, apply_verbosity, exit_command, guarded, nonempty_path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", help="a preset name from experiments/presets/ or a TOML file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a run-config key")
    parser.add_argument("--node-data", type=Path, metavar="DIR",
                        help="each SuperNode K trains on its own data in DIR/node-K (experiments.write_partitions "
                             "writes such folders) instead of its partition of the run's data set")
    parser.add_argument("--tls", action="store_true", help="TLS with a throw-away CA for 127.0.0.1/localhost")
    parser.add_argument("--auth", action="store_true", help="SuperNode authentication (implies --tls)")
    parser.add_argument("--out", type=nonempty_path, help="output directory (default runs/deploy-<preset>-<time>)")
    parser.add_argument("--cpus-per-client", type=float, default=1.0,
                        help="CPU threads per SuperNode's ClientApp (as in simulation; default 1)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results of a run with another config in --out (without it: refused, naming the keys)")
    add_verbosity_options(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    apply_verbosity(args)
    return guarded(lambda: run_command(args))


def run_command(args: argparse.Namespace) -> int:
    """Validate, then start the local deployment and run on it (see the module docstring)."""
    # torch and Flower are imported only once the arguments parsed.
    from experiments.runtime.deployment import DeploymentError, Security, deploy
    from experiments.runtime.machine import ClientResources, check_data, check_machine
    from experiments.runtime.output_dir import create_output_dir, unique_output_dir
    from experiments.runtime.run_config import load_preset, parse_overrides, resolve_config
    from experiments.runtime.run_endings import RunFailed
    config = resolve_config(load_preset(args.preset) if args.preset else {}, parse_overrides(args.set))
    check_data([config])
    check_machine([config], ClientResources(args.cpus_per_client))  # each SuperNode's threads fit the machine
    security = Security(tls=args.tls or args.auth, auth=args.auth)
    name = Path(args.preset).stem if args.preset else "main"
    out_dir = create_output_dir(args.out) if args.out else unique_output_dir(Path("runs"), f"deploy-{name}")
    try:
        summary = deploy(config, out_dir, security, args.cpus_per_client, overwrite=args.overwrite,
                         node_data=args.node_data.resolve() if args.node_data else None)
    except (RunFailed, DeploymentError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    print(f"results: {out_dir} ({security.name}, {config['num-clients']} SuperNodes)")
    return 0


if __name__ == "__main__":
    exit_command(main())
