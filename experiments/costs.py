"""Cost of one client's local training, per method: FLOPs, parameters held, memory, time, and
the bytes it receives and sends each round.

    .venv/bin/python -m experiments.costs                     # FedAlign's ResNet-56 (BatchNorm), CIFAR-100 shape
    .venv/bin/python -m experiments.costs --model resnet56-bn --methods fedavg,fedprox,moon,gradaug-n1,gradaug-n2,fedalign \\
        --input-shape 3,32,32 --num-classes 100 --batch-size 64 --steps 10 --device auto --out costs.csv

For each method, on Basin's own client path (the real strategy's training message, the
ClientApp's ``LocalRound``, synthetic data): forward and training GFLOPs per sample,
parameters held during local training, peak GPU memory and seconds per step, each also
as a ratio to FedAvg measured in the same process; and the bytes one client receives (down)
and sends (up) in a round, every array of every message (SCAFFOLD's controls, MIME's extra
exchange), measured on a round of the method's strategy with the ClientApp's own replies.

In detail: docs/command-lines.md (``.venv/bin/python -m experiments.costs``)."""

from __future__ import annotations

import argparse

from experiments.runtime.cli import exit_command, guarded, nonempty_path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=".venv/bin/python -m experiments.costs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="resnet56-bn",
                        help="a model name (default resnet56-bn, FedAlign's BatchNorm ResNet-56, the network of its cost "
                             "table; `.venv/bin/python -m experiments.run --list-keys` lists them)")
    parser.add_argument("--methods", default=None,
                        help="comma-separated strategy names or cost-table entries such as gradaug-n2 (default: each method's cost-table "
                             "entries, FedAvg, FedProx, SCAFFOLD, FedCM, … FedAlign)")
    parser.add_argument("--input-shape", default="3,32,32", help="C,H,W of one sample (default 3,32,32: CIFAR)")
    parser.add_argument("--num-classes", type=int, default=100, help="classifier outputs (default 100: CIFAR-100)")
    parser.add_argument("--batch-size", type=int, default=64, help="local batch size (default 64)")
    parser.add_argument("--steps", type=int, default=10, help="measured local steps per method (default 10)")
    parser.add_argument("--round-steps", type=int, default=0,
                        help="local steps of one round; > 0 adds an s/round column (default 0: omitted)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    parser.add_argument("--threads", type=int, default=0,
                        help="CPU threads of torch (default 0: torch's default); 1 gives steadier CPU timings "
                             "on a busy machine")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a run-config key for every method (e.g. prox-mu=0.01)")
    parser.add_argument("--out", type=nonempty_path, help="also write the table as CSV to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The implementation imports torch and Flower: only once the arguments parsed.
    from experiments.measurement.method_costs import run_command

    return guarded(lambda: run_command(args))


if __name__ == "__main__":
    exit_command(main())
