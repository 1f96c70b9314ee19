"""Speed of Basin's Flower simulation against a bare PyTorch loop doing the same client work.

    .venv/bin/python -m experiments.benchmark                          # IMA, Fashion-MNIST shards, 20 rounds
    .venv/bin/python -m experiments.benchmark --rounds 3 --device cpu --set data-dir=/path/to/fashion-mnist
    .venv/bin/python -m experiments.benchmark --preset none --set num-clients=4 --set participation=0.5 --rounds 3
    .venv/bin/python -m experiments.benchmark --clients --set data-dir=/path/to/fashion-mnist   # K = 100, 1,000, 10,000
    .venv/bin/python -m experiments.benchmark --startup              # the wait before round 1, stage by stage
    .venv/bin/python -m experiments.benchmark --methods              # client steps/s of every method, its step mode, × FedAvg
    .venv/bin/python -m experiments.benchmark --methods --modes      # measures nothing: the step mode of every method on CUDA
    .venv/bin/python -m experiments.benchmark --layouts --threads 1  # every conv model's steps/s per memory layout, the ratio

One invocation runs one setup twice, as a real ``flwr run`` simulation and as a bare
PyTorch loop of the same client work in this process, and prints client steps per second,
their ratio, Flower's overhead per round and its start-up; ``--clients``, ``--startup`` and
``--methods`` measure how a run grows with the number of clients, the wait before round 1,
and every method's step speed. Writes ``benchmark.json`` and the run's files into ``--out``.

In detail: docs/command-lines.md (``.venv/bin/python -m experiments.benchmark``)."""
from __future__ import annotations

import argparse

from experiments.runtime.cli import exit_command, gpu_share, guarded, nonempty_path, parallel_runs

DEFAULT_PRESET = "ima-fmnist-shards"
NO_PRESET = "none"
DEFAULT_CLIENT_COUNTS = (100, 1_000, 10_000)


def client_counts(text: str | tuple[int, ...]) -> tuple[int, ...]:
    """``--clients``'s comma-separated list of client counts, each >= 1."""
    if isinstance(text, tuple):
        return text
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: comma-separated integers >= 1, e.g. 100,1000")
    return counts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=".venv/bin/python -m experiments.benchmark", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default=None,
                        help=f"preset name or TOML file (default {DEFAULT_PRESET}; with --clients the setup described "
                             f"above; '{NO_PRESET}': pyproject defaults)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a run-config key")
    parser.add_argument("--rounds", type=int, default=None,
                        help="num-rounds of both runs (default 20; with --clients 5)")
    parser.add_argument("--device", help="shortcut for --set device=DEVICE (auto, cpu, cuda)")
    parser.add_argument("--cpus-per-client", type=float, default=1.0, help="Ray CPUs per virtual client (default 1)")
    parser.add_argument("--gpus-per-client", type=gpu_share, default=None, metavar="FRACTION|auto",
                        help="Ray GPU fraction per virtual client, e.g. 0.125 for 8 clients per GPU (default auto: "
                             "on CUDA a round's whole cohort at once, within cores and GPU memory; else 0)")
    parser.add_argument("--mps", action="store_true", help="run the Flower run's client processes under CUDA MPS")
    parser.add_argument("--sweep", action="store_true",
                        help="instead: runs per hour of a small grid (FedAvg and FedAvg+IMA on #C=2 and Dir(0.1)) run "
                             "one at a time and --parallel at once")
    parser.add_argument("--parallel", type=parallel_runs, default=None, metavar="N|auto",
                        help="with --sweep: runs at once in the second pass (default auto; at least 2)")
    parser.add_argument("--clients", nargs="?", const=DEFAULT_CLIENT_COUNTS, type=client_counts, default=None,
                        metavar="K,K,…",
                        help="instead: one run per number of clients K at a fixed cohort, and a table of how "
                             "start-up, rounds and memory grow with K (default 100,1000,10000)")
    parser.add_argument("--startup", nargs="?", const=3, type=int, default=None, metavar="N",
                        help="instead: the wait before round 1, stage by stage, of `.venv/bin/python -m experiments.run "
                             "--set num-clients=100 --set participation=0.1 --set num-rounds=10 --set "
                             "min-partition-size=1 --set alpha=1.0` and of the main job, each run N times (default 3)")
    parser.add_argument("--methods", nargs="?", const="all", default=None, metavar="all|M,M,…",
                        help="instead: client steps/s and step mode of every shipped method (or those named), "
                             "ratio to FedAvg's")
    parser.add_argument("--modes", action="store_true",
                        help="with --methods: measure nothing, print the step mode each method would take on CUDA")
    parser.add_argument("--resnet", default="resnet20-gn", help="with --methods: the CIFAR-shaped ResNet (default resnet20-gn)")
    parser.add_argument("--steps", type=int, default=None, help="with --methods: timed steps per method (default 30)")
    parser.add_argument("--cohort", type=int, default=10, help="with --clients: clients per round (default 10)")
    parser.add_argument("--layouts", nargs="?", const="all", default=None, metavar="all|M,M,…",
                        help="instead: client steps/s of every convolutional model (or those named) in each memory "
                             "layout (contiguous, channels-last) and their ratio, alternating in one process")
    parser.add_argument("--threads", type=int, default=1, help="with --layouts: torch threads (default 1)")
    parser.add_argument("--repeats", type=int, default=3, help="with --layouts: alternations per model (default 3)")
    parser.add_argument("--out", type=nonempty_path, help="output directory (default runs/benchmark-<time>)")
    # The implementation (experiments/measurement/) reads these from the arguments: it does not import this module.
    parser.set_defaults(default_preset=DEFAULT_PRESET, no_preset=NO_PRESET)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.startup is not None:  # times user commands in their own processes: nothing heavy here
        from experiments.measurement.startup_timing import startup_command

        if args.startup < 1:
            raise SystemExit(f"--startup {args.startup} is not allowed; allowed: a number of repeats >= 1")
        return guarded(lambda: startup_command(args))
    if args.modes and args.methods is None:
        raise SystemExit("--modes is not allowed alone; allowed: with --methods")
    if args.steps is not None and args.steps < 1:
        raise SystemExit(f"--steps {args.steps} is not allowed; allowed: a number of steps >= 1")
    if args.layouts is not None:
        from experiments.measurement.layout_speed import layouts_command

        if args.threads < 1 or args.repeats < 1:
            raise SystemExit("--threads and --repeats are not allowed below 1; allowed: integers >= 1")
        args.steps = args.steps or 10
        if args.out:
            from experiments.runtime.output_dir import create_output_dir

            args.out = create_output_dir(args.out, "--out")
        return guarded(lambda: layouts_command(args))
    if args.methods is not None:
        from experiments.measurement.method_speed import methods_command
        from experiments.runtime.run_config import parse_overrides

        args.steps = args.steps or 30
        if args.out:
            from experiments.runtime.output_dir import create_output_dir

            args.out = create_output_dir(args.out, "--out")
        return guarded(lambda: methods_command(args, parse_overrides(args.set)))
    # The implementation imports torch and Flower: only once the arguments parsed.
    from experiments.measurement.flower_overhead import run_command
    from experiments.measurement.many_clients import clients_command
    from experiments.measurement.sweep_timing import sweep_command

    if args.rounds is None:
        args.rounds = 5 if args.clients else 20
    command = clients_command if args.clients else sweep_command if args.sweep else run_command
    return guarded(lambda: command(args))


if __name__ == "__main__":
    exit_command(main())
