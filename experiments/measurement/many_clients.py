"""Runs of many clients (``experiments.benchmark --clients K1,K2,…``): for each client count,
the job's wall time, seconds per round and peak memory on one setup, so that what grows
with the number of clients shows."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import psutil

from clients.log import log
from clients.training import select_device
from experiments.runtime.cli import UsageError
from experiments.runtime.launch import launch
from experiments.runtime.machine import check_machine, client_resources
from experiments.runtime.output_dir import LOCK_FILE, OutputLock, create_output_dir, unique_output_dir
from experiments.runtime.processes import processes_of_home
from experiments.runtime.run_config import load_preset, parse_overrides, resolve_config
from experiments.runtime.run_endings import RunFailed
from partitions import load_dataset
from strategies.cohort import cohort_size

# --clients: the setup whose cost should depend on the cohort only. Every client holds 300
# Fashion-MNIST images (6 steps of 50) at every K: a near-IID client-wise Dirichlet with
# FedSWA's refill (the 60,000 images are reused from K = 200 on), so that a round's client
# work is the same at every K and only K differs (an IID split of the 60,000 gave each of
# 10,000 clients 6 images: one step, whose short work exposed Ray's hand-over gaps).
CLIENTS_SETUP = {"dataset": "fashion-mnist", "partition": "dirichlet-client", "alpha": 100.0,
                 "client-dirichlet-concentration": "uniform", "client-dirichlet-exhaustion": "refill",
                 "samples-per-client": 300, "local-epochs": 1, "batch-size": 50, "min-partition-size": 1,
                 "strategy": "fedavg", "averaging": "none"}


def clients_config(args, num_clients: int) -> dict[str, Any]:
    """The validated run config of one ``--clients`` run: CLIENTS_SETUP (or ``--preset``),
    ``--set``, then K clients, ``--cohort`` of them per round, ``--rounds``."""
    if args.rounds < 1 or not 1 <= args.cohort <= num_clients:
        raise UsageError(f"--rounds {args.rounds} --cohort {args.cohort} with {num_clients} clients is not allowed; "
                         f"allowed: rounds >= 1, 1 <= cohort <= every --clients count")
    base = CLIENTS_SETUP if args.preset is None else {} if args.preset == args.no_preset else load_preset(args.preset)
    overrides = parse_overrides(args.set + ([f"device={args.device}"] if args.device else []))
    config = resolve_config(base, overrides, {"num-clients": num_clients, "participation": args.cohort / num_clients,
                                              "num-rounds": args.rounds})
    load_dataset(config["dataset"], config["data-dir"])  # missing data fails here, before Flower starts
    return config


class JobMemory:
    """Peak memory of one run's processes while it runs: the proportional set size (shared
    pages divided among the processes sharing them) summed over every process of the run's
    FLWR_HOME, which the launch records in its output directory's lock; sampled every
    ``interval`` seconds in a thread."""

    def __init__(self, out_dir: Path, interval: float = 0.5):
        self.out_dir, self.interval = out_dir, interval
        self.peak_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> JobMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                lines = (self.out_dir / LOCK_FILE).read_text().splitlines()
            except OSError:
                continue
            if len(lines) >= 2:
                self.peak_mib = max(self.peak_mib, sum(map(proportional_set_mib, processes_of_home(lines[1]))))


def proportional_set_mib(pid: int) -> float:
    """A process's proportional set size in MiB (0 once it has ended; psutil reads it on Linux)."""
    try:
        return psutil.Process(pid).memory_full_info().pss / 2**20
    except (psutil.Error, AttributeError):  # gone, not ours, or no PSS on this system
        return 0.0


def clients_command(args) -> int:
    """One Flower run per ``--clients`` count at a fixed cohort, then their table; writes
    ``benchmark-clients.json``."""
    configs = [clients_config(args, k) for k in args.clients]  # every setup is checked before the first starts
    resources = client_resources(configs, args.cpus_per_client, args.gpus_per_client)
    check_machine(configs, resources)
    out_dir = create_output_dir(args.out) if args.out else unique_output_dir(Path("runs"), "benchmark-clients")
    rows = []
    with OutputLock(out_dir):
        # Untimed: the first K for one round, so that no row pays for decoding the data set
        # into its cache or for a cold file cache.
        log.getChild("benchmark").info("warm-up run (not measured)")
        try:
            launch({**configs[0], "num-rounds": 1}, out_dir / "warm-up", resources, progress=sys.stderr.isatty(),
                   label="warm-up")
        except RunFailed as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        for config in configs:
            run_dir = out_dir / f"clients-{config['num-clients']}"
            log.getChild("benchmark").info(f"{config['num-clients']:,} clients, {cohort_size(config)} per round, "
                                           f"{config['num-rounds']} rounds")
            started = time.perf_counter()
            try:
                with JobMemory(run_dir) as memory:
                    summary = launch(config, run_dir, resources, progress=sys.stderr.isatty(),
                                     label=f"K={config['num-clients']}")
            except RunFailed as error:
                print(f"error: {error}", file=sys.stderr)
                return 1
            rows.append(clients_row(config, pd.read_csv(run_dir / "results.csv"), time.perf_counter() - started,
                                    summary, memory.peak_mib))
        figures = {"rows": rows, "device": str(select_device(configs[0]["device"])), "cpu-count": os.cpu_count(),
                   "resources": dataclasses.asdict(resources), "config": {**configs[0], "num-clients": None,
                                                                          "participation": None, "output-dir": None}}
        print_clients_table(rows)
        (out_dir / "benchmark-clients.json").write_text(json.dumps(figures, indent=2))
    print(f"results: {out_dir / 'benchmark-clients.json'}")
    return 0


def clients_row(config: dict[str, Any], rows: pd.DataFrame, wall: float, summary: dict[str, Any],
                peak_mib: float) -> dict[str, Any]:
    """One ``--clients`` run's figures (seconds, MiB)."""
    overhead = (rows["train-seconds"] - rows["client-seconds"])[rows["round"] >= 2]
    return {
        "clients": config["num-clients"], "cohort": cohort_size(config), "rounds": config["num-rounds"],
        "wall-seconds": wall, "round-1-starts-seconds": summary.get("startup-seconds"),
        "round-1-seconds": float(rows["round-seconds"].iloc[0]),
        "overhead-rounds-2-on-seconds": float(overhead.mean()) if len(overhead) else None,
        "wall-minus-rounds-seconds": wall - float(rows["round-seconds"].sum()),
        "peak-memory-mib": peak_mib,
    }


CLIENTS_COLUMNS = (("wall s", "wall-seconds", ".1f"), ("round 1 starts s", "round-1-starts-seconds", ".1f"),
                   ("round 1 s", "round-1-seconds", ".1f"), ("overhead 2..N s", "overhead-rounds-2-on-seconds", ".3f"),
                   ("wall - rounds s", "wall-minus-rounds-seconds", ".1f"), ("peak MiB", "peak-memory-mib", ".0f"))


def print_clients_table(rows: list[dict[str, Any]]) -> None:
    """The ``--clients`` table: each figure and, beside it, its ratio to the first row's;
    then the memory growth per 100 clients."""
    print(f"{'clients K':>10}" + "".join(f"{title:>24}" for title, _, _ in CLIENTS_COLUMNS))
    first = rows[0]
    for row in rows:
        cells = []
        for _, key, fmt in CLIENTS_COLUMNS:
            value, base = row[key], first[key]
            ratio = f" ({value / base:.2f}x)" if value is not None and base else ""
            cells.append("n/a" if value is None else f"{value:{fmt}}{ratio}")
        print(f"{row['clients']:>10,}" + "".join(f"{cell:>24}" for cell in cells))
    for row in rows[1:]:
        growth = (row["peak-memory-mib"] - first["peak-memory-mib"]) / (row["clients"] - first["clients"]) * 100
        print(f"memory K={first['clients']:,} -> {row['clients']:,}: {growth:+.2f} MiB per 100 clients")
