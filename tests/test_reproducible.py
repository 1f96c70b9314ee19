"""The same config and seed give the same bits however the machine is shared.

A reference run (two client processes of one CPU each) against the same config with one
process of two CPUs and with as many processes as the cohort (a local Ray cluster of one
node with that many CPUs). Compared by
``experiments.runtime.reproducible.compare_runs``: every round of results.csv (timing columns
aside) and every tensor of final_model.pt. Elsewhere, the same promise: a run of a sweep
running two at once (tests/test_sweep.py, its real sweep), a two-node Ray cluster
(tests/test_ray_cluster.py), the Deployment Engine (tests/test_deployment.py), a resume
after SIGKILL (tests/test_launcher_death.py).
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from experiments import run
from experiments.runtime.launch import launch
from experiments.runtime.machine import ClientResources, machine_cpus
from experiments.runtime.ray_cluster import LocalRayCluster
from experiments.runtime.reproducible import compare_runs
from experiments.runtime.run_config import resolve_config
from strategies.cohort import cohort_size

# The digits job, small: 8 clients, 4 a round, 3 rounds of 2 local epochs.
CONFIG = {"num-clients": 8, "participation": 0.5, "num-rounds": 3, "local-epochs": 2, "device": "cpu"}
# The reference: two client processes of one CPU each (this machine's 2 cores), on the Ray
# cluster of the session's other reference runs (tests/conftest.py's flower_runs).
# Heterogeneity beyond the data: clients available with their own probabilities, device
# speeds spread over an order of magnitude, a deadline that cuts some clients' work short,
# local epochs drawn per client and round. Every draw depends on (seed, round, client) only.
SYSTEMS = {**CONFIG, "participation-model": "availability", "availability-min": 0.4, "system-speeds": "lognormal",
           "speed-sigma": 1.0, "straggler-policy": "partial", "round-deadline": 0.5, "local-epochs-range": "1-3"}
FLOWER_RUNS = {"reproducible-reference": CONFIG, "reproducible-systems-reference": SYSTEMS}
# Real runs compared bit for bit: the second tier (.ci/run).
pytestmark = [pytest.mark.slow, pytest.mark.flower_runs("reproducible-reference", "reproducible-systems-reference")]


@pytest.fixture(scope="module")
def reference(flower_runs) -> Path:
    return flower_runs["reproducible-reference"].completed()


def _assert_same(reference: Path, other: Path) -> None:
    comparison = compare_runs(reference, other)
    assert comparison.identical, comparison.report(reference, other)
    assert comparison.rounds == CONFIG["num-rounds"] and comparison.tensors > 0


@pytest.mark.skipif(machine_cpus() < 2, reason="needs 2 CPU cores for a client of 2 CPUs")
def test_one_client_process_of_two_cpus_gives_the_same_bits(reference, tmp_path):
    """Ray gives this client process OMP_NUM_THREADS = 2; torch-threads keeps it at 1. On
    the code before the key the final models differed (~5e-8)."""
    launch(resolve_config(CONFIG), tmp_path, ClientResources(2.0), progress=False)
    _assert_same(reference, tmp_path)
    arithmetic = json.loads((tmp_path / "summary.json").read_text())["arithmetic"]
    assert arithmetic["torch-threads"] == 1 and arithmetic["device"] == "cpu"
    assert arithmetic["torch"] == torch.__version__ and arithmetic["flwr"] == importlib.metadata.version("flwr")


def test_as_many_client_processes_as_the_cohort_give_the_same_bits(reference, tmp_path):
    """A local Ray cluster with a CPU per cohort member: the whole cohort trains at once."""
    cohort = cohort_size(resolve_config(CONFIG))
    with LocalRayCluster(True, cohort) as address:
        launch(resolve_config(CONFIG), tmp_path, ClientResources(1.0), progress=False, ray_address=address)
    _assert_same(reference, tmp_path)


def test_participation_and_the_clock_draw_the_same_in_as_many_processes_as_the_cohort(flower_runs, tmp_path):
    """The reference ran its clients in two processes; here the whole cohort trains at once.
    Same cohorts, available counts, partial work, simulated time and model, bit for bit."""
    reference = flower_runs["reproducible-systems-reference"].completed()
    config = resolve_config(SYSTEMS)
    with LocalRayCluster(True, cohort_size(config)) as address:
        launch(config, tmp_path, ClientResources(1.0), progress=False, ray_address=address)
    comparison = compare_runs(reference, tmp_path)
    assert comparison.identical, comparison.report(reference, tmp_path)
    rows = pd.read_csv(reference / "results.csv")
    assert rows["clients-partial"].sum() > 0 and rows["simulated-time"].iloc[-1] > 0  # the clock cut some work
    assert (rows["clients-available"] < CONFIG["num-clients"]).any()


def test_check_reproducible_says_the_first_round_and_tensor_that_differ(reference, tmp_path, capsys):
    assert run.main(["--check-reproducible", str(reference), str(reference)]) == 0
    assert "identical" in capsys.readouterr().out
    changed = tmp_path / "changed"
    changed.mkdir()
    for name in ("results.csv", "summary.json", "config.json"):
        (changed / name).write_bytes((reference / name).read_bytes())
    rows = (changed / "results.csv").read_text().splitlines()
    header = rows[0].split(",")
    second = rows[2].split(",")
    second[header.index("test-loss")] += "1"  # round 2's loss, one more digit
    rows[2] = ",".join(second)
    (changed / "results.csv").write_text("\n".join(rows) + "\n")
    model = torch.load(reference / "final_model.pt", weights_only=True)
    last = list(model)[-1]
    model[last] = model[last].clone()
    model[last].view(-1)[0] += 1e-6
    torch.save(model, changed / "final_model.pt")
    summary = json.loads((changed / "summary.json").read_text())
    summary["arithmetic"]["torch-threads"] = 2
    (changed / "summary.json").write_text(json.dumps(summary))

    assert run.main(["--check-reproducible", str(reference), str(changed)]) == 1
    out = capsys.readouterr().out
    assert "first difference at round 2: test-loss" in out
    assert f"first difference in {last!r}: 1 of" in out
    assert "torch-threads 1 vs 2" in out
    assert run.main(["--check-reproducible", str(reference), str(tmp_path / "nothing")]) == 2
    assert "holds no results.csv" in capsys.readouterr().err
