"""What participation models and the simulated clock cost, against ``uniform`` in the same run.

Two measurements, printed as ratios:

1. Real rounds at 100 clients (IID digits, so every client has the same work; in this
   process, through the ClientApp's handlers: experiments/measurement/in_process_grid.py),
   alternating ``uniform`` without a clock and ``availability`` + a lognormal clock +
   ``wait``: the median round time of each and their ratio. The target is ≤ 1.05.
2. The server's own work per round at 10², 10⁴ and 10⁶ clients (sampling a cohort of 100, the
   draws, each sampled client's config entries): milliseconds per round under ``uniform`` and
   under the models, and the models' cost as a fraction of the round time measured in 1.

    .venv/bin/python -m experiments.participation_benchmark [--rounds 12] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from clients.flower_internals import task_identity
from experiments.measurement.in_process_grid import InProcessGrid
from experiments.runtime.run_config import resolve_config
from partitions import load_dataset
from strategies.methods.strategy_builder import build_strategy
from strategies.participation import build_participation
from strategies.server_work import train_rounds
from strategies.system_clock import SystemClock

SMALL = {"dataset": "digits", "partition": "iid", "num-clients": 100, "clients-per-round": 10, "local-epochs": 1,
         "batch-size": 4, "momentum": 0.0, "min-partition-size": 1, "checkpoint-every": 0, "torch-threads": 1,
         "server-torch-threads": 1, "device": "cpu"}
MODELS = {"participation-model": "availability", "availability-min": 0.5, "system-speeds": "lognormal"}


class _Rows(list):
    """What the round loop writes to (strategies/results.RunRecorder's part), in memory."""

    def __init__(self, directory: Path):
        super().__init__()
        self.directory, self.rows = directory, self

    def extend_columns(self, extra):
        pass

    def describe(self, **entries):
        pass

    def training_starts(self):
        pass

    def record_clients_layout(self, channels_last):
        pass

    def append_client_evaluation(self, server_round, clients):
        pass


def round_seconds(keys: dict, rounds: int) -> list[float]:
    """The train-seconds of each round of a run (send, client work, aggregate)."""
    config = resolve_config({}, {**SMALL, "num-rounds": rounds, **keys})
    with tempfile.TemporaryDirectory() as directory, task_identity(1, 0, 1):
        rows = _Rows(Path(directory))
        train_rounds(InProcessGrid(config, config["num-clients"]), config, rows, None,
                     load_dataset("digits", "", True), torch.device("cpu"))
    return [float(row["train-seconds"]) for row in rows[1:]]  # round 1 warms the process up


def server_work_ms(num_clients: int, keys: dict, rounds: int = 20) -> float:
    """Milliseconds per round of the server's sampling and per-client entries at ``num_clients``."""
    config = {**resolve_config({}, {**SMALL, **keys}), "num-clients": num_clients}
    strategy = build_strategy(resolve_config({}, SMALL))
    participation = build_participation(config)
    clock = SystemClock(config) if config["system-speeds"] != "none" else None
    strategy.bind_partitions({p: p for p in range(num_clients)}, 100, 0, participation=participation, clock=clock)
    started = time.perf_counter()
    for server_round in range(1, rounds + 1):
        strategy.client_entries(server_round, strategy.sample_partitions(server_round))
    return (time.perf_counter() - started) / rounds * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12, help="rounds per run (the first is not timed)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each")
    args = parser.parse_args()
    uniform, models = [], []
    for _ in range(args.repeats):
        uniform += round_seconds({}, args.rounds)
        models += round_seconds(MODELS, args.rounds)
    base, with_models = statistics.median(uniform), statistics.median(models)
    print(f"100 clients, 10 a round: median round {base * 1e3:.1f} ms uniform, {with_models * 1e3:.1f} ms with "
          f"availability + lognormal clock; ratio {with_models / base:.3f} (target <= 1.05)")
    print("server work per round (cohort 100): clients, uniform ms, models ms, models / uniform, models / round")
    for num_clients in (100, 10_000, 1_000_000):
        plain, heavy = server_work_ms(num_clients, {}), server_work_ms(num_clients, MODELS)
        print(f"  {num_clients:>9,}  {plain:8.3f}  {heavy:8.3f}  {heavy / plain:8.1f}x  "
              f"{heavy / (base * 1e3):8.3f}")


if __name__ == "__main__":
    main()
