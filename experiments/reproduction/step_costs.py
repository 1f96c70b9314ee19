"""Time FedAvg's step of every model the presets and paper tables run, here, and write
experiments/measured/step-costs.csv, the table the estimates read (experiments/reproduction/estimates.py):

    .venv/bin/python -m experiments.reproduction.step_costs
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Mapping, Sequence
from typing import Any

from experiments.reproduction.estimates import STEP_COSTS


def measure_step_costs(configs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """FedAvg's step of each distinct (model, data set, batch size) of ``configs``, timed here."""
    import datetime

    from experiments.reproduction.runner import step_seconds

    distinct = {(c["model"], c["dataset"], c["batch-size"]): {**c, "strategy": "fedavg"} for c in configs}
    seconds = step_seconds(distinct.values(), progress=True)
    today = datetime.date.today().isoformat()
    return [{"model": model, "dataset": dataset, "batch-size": batch, "seconds-per-step": f"{value:.6f}", "date": today}
            for (model, dataset, batch, _), value in sorted(seconds.items())]


def shipped_configs() -> list[dict[str, Any]]:
    """The resolved configs of every preset and every paper table's runnable cell."""
    from experiments.reproduction.table_cells import load_table, table_names
    from experiments.runtime.run_config import PRESETS_DIR, load_preset, resolve_config

    configs = [resolve_config(load_preset(path.stem), {}) for path in sorted(PRESETS_DIR.glob("*.toml"))]
    for name in table_names():
        configs += [dict(cell.config) for cell in load_table(name, build_partitions=False).cells if cell.config]
    return configs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m experiments.reproduction.step_costs",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    rows = measure_step_costs(shipped_configs())
    with open(STEP_COSTS, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["model", "dataset", "batch-size", "seconds-per-step", "date"])
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} step costs written to {STEP_COSTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
