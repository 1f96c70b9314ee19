"""A sweep's runs per hour (``experiments.benchmark --sweep``): a small grid run one at a
time, then ``--parallel`` at once, as experiments.sweep runs them."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from clients.log import log
from experiments.measurement.flower_overhead import config_of
from experiments.runtime.machine import check_machine, client_resources, machine_cpus
from experiments.runtime.mps import MpsDaemon, check_mps
from experiments.runtime.output_dir import OutputLock, create_output_dir, unique_output_dir
from experiments.runtime.ray_cluster import LocalRayCluster

# The small grid of the sweep mode: the base setup's two label skews, FedAvg with and without IMA.
SWEEP_GRID = {
    "partition": [{"partition": "shards", "classes-per-client": 2}, {"partition": "dirichlet", "alpha": 0.1}],
    "averaging": ["none", "ima"],
}


def sweep_command(args) -> int:
    """Runs per hour of SWEEP_GRID (on the preset, ``--set`` and ``--rounds``), run through
    ``experiments.sweep`` one at a time, then ``--parallel`` at once, each pass in its own
    folder (nothing resumed); writes ``benchmark-sweep.json``."""
    from experiments.runtime.sweep_definition import load_sweep
    from experiments.runtime.sweep_runs import auto_parallel, run_sweep

    config = config_of(args)  # validates the base setup
    out_dir = create_output_dir(args.out) if args.out else unique_output_dir(Path("runs"), "benchmark-sweep")
    with OutputLock(out_dir):
        spec = out_dir / "sweep.toml"
        base = {k: v for k, v in config.items() if k not in ("output-dir", "averaging", "partition")}
        spec.write_text(
            'name = "benchmark-sweep"\n[set]\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in base.items())
            + "[grid]\n" + "".join(f"{axis} = {_toml_list(values)}\n" for axis, values in SWEEP_GRID.items())
        )
        sweep = load_sweep(spec)
        parallel = max(2, args.parallel or auto_parallel(sweep))
        resources = client_resources([r.config for r in sweep.runs], args.cpus_per_client, args.gpus_per_client, parallel)
        check_machine([r.config for r in sweep.runs], resources)
        check_mps(args.mps)
        figures = {"runs": len(sweep.runs), "rounds": args.rounds, "parallel": parallel, "mps": args.mps,
                   "resources": dataclasses.asdict(resources)}
        with MpsDaemon(args.mps) as mps:
            if mps.message:
                log.warning(mps.message)
            figures["mps"] = mps.active
            for label, at_once in (("one-at-a-time", 1), (f"parallel-{parallel}", parallel)):
                started = time.perf_counter()
                # As experiments.sweep runs them: one after another on one Ray cluster (its start
                # timed with the pass), at once each with its own Ray.
                with LocalRayCluster(at_once == 1, machine_cpus()) as job_ray:
                    table = run_sweep(dataclasses.replace(sweep, resources=resources), out_dir / label,
                                      progress=sys.stderr.isatty(), ray_address=job_ray, parallel=at_once)
                seconds = time.perf_counter() - started
                completed = int(table["status"].eq("completed").sum())
                figures[label] = {"seconds": seconds, "completed": completed, "runs-per-hour": completed / seconds * 3600}
                print(f"{label}: {completed} of {len(sweep.runs)} runs in {seconds:.1f} s: "
                      f"{completed / seconds * 3600:.0f} runs per hour")
        ratio = figures[f"parallel-{parallel}"]["runs-per-hour"] / figures["one-at-a-time"]["runs-per-hour"]
        figures["parallel-speed-up"] = ratio
        print(f"--parallel {parallel}: {ratio:.2f}x the runs per hour of one at a time")
        (out_dir / "benchmark-sweep.json").write_text(json.dumps(figures, indent=2))
    print(f"results: {out_dir / 'benchmark-sweep.json'}")
    return 0


def _toml_list(values: list) -> str:
    items = [("{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items()) + "}") if isinstance(value, dict)
             else json.dumps(value) for value in values]
    return "[" + ", ".join(items) + "]"
