"""Run this app in a local simulation with the checkout's environment, printing Flower's
log as it comes, and stop every process `flwr run` started (its SuperLink, SuperExec and
simulation) when it ends, Ctrl-C included:

    .venv/bin/python examples/ima-quickstart/run.py --run-config "num-server-rounds=10" --num-supernodes 4

A plain `flwr run examples/ima-quickstart` needs the environment's `bin/` on PATH (flwr
starts `flower-superlink` from there) and leaves that SuperLink running afterwards; this
script does both for you (Basin's experiments.runtime.launch.run_app). The log is also kept in
flwr.log next to this file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments.runtime.launch import run_app

APP = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-config", default="", help='the app\'s config overrides, e.g. "num-server-rounds=10"')
    parser.add_argument("--num-supernodes", type=int, default=4, help="simulated clients (default 4)")
    args = parser.parse_args(argv)
    log = run_app(APP, APP / "flwr.log", args.num_supernodes, args.run_config, echo=True)
    # `flwr run --stream` exits 0 even when the run failed: the app's last line says it finished.
    return 0 if "IMA's model after the last round" in log else 1


if __name__ == "__main__":
    sys.exit(main())
