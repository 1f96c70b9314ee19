"""Per-client accuracy (``client-evaluation``): each accepted client's score of the model it
received, on its held-out split, one row per client and round in client-evaluation.csv,
read back by the Python API; the cohort summaries of results.csv are its mean and worst
decile; a resumed run keeps the rows of the rounds its checkpoint holds."""

from __future__ import annotations

import csv

import numpy as np
import pandas as pd
import pytest
import torch

from clients.data import held_out_count, partition_indices
from experiments.job_results import Job
from experiments.measurement.in_process_grid import InProcessGrid
from experiments.runtime.run_config import resolve_config
from partitions import load_dataset
from partitions.feasibility import partition_settings
from strategies.config import summary_horizon
from strategies.results import CLIENT_EVALUATION_FILE, RunRecorder
from strategies.server_work import train_rounds

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py


def test_each_clients_accuracy_on_its_held_out_split_is_a_row_of_its_own(tmp_path):
    config = resolve_config({}, {"num-clients": 6, "participation": 0.5, "num-rounds": 2, "local-epochs": 1,
                                 "client-evaluation": 0.25, "checkpoint-every": 0})
    recorder = RunRecorder(tmp_path / "run", config, summary_horizon(config), config["target-accuracy"])
    train_rounds(InProcessGrid(config, 6), config, recorder, None, load_dataset("digits", "", True),
                 torch.device("cpu"))
    clients = Job(tmp_path, {"FedAvg": tmp_path / "run"}).client_evaluation
    assert list(clients.columns) == ["run", "round", "partition", "node", "examples", "accuracy", "loss"]
    assert clients.groupby("round").size().tolist() == [3, 3]  # the cohort, each round
    sizes = [len(indices) for indices in partition_indices("digits", "", True, partition_settings(config))]
    assert all(row.examples == held_out_count(sizes[row.partition], 0.25) for row in clients.itertuples())
    assert all(row.node == 100 + row.partition for row in clients.itertuples())
    assert clients["accuracy"].between(0, 1).all() and np.isfinite(clients["loss"]).all()
    rounds = pd.read_csv(tmp_path / "run" / "results.csv").set_index("round")
    for server_round, cohort in clients.groupby("round"):
        assert rounds.loc[server_round, "client-accuracy-mean"] == pytest.approx(cohort["accuracy"].mean())
        assert rounds.loc[server_round, "client-accuracy-worst-10pct"] == pytest.approx(cohort["accuracy"].min())


def test_a_resumed_run_keeps_the_rows_of_the_rounds_its_checkpoint_holds(tmp_path):
    config = resolve_config({}, {"client-evaluation": 0.25})
    (tmp_path / CLIENT_EVALUATION_FILE).write_text("round,partition,node,examples,accuracy,loss\n"
                                                   "1,0,100,5,0.4,1.2\n2,0,100,5,0.6,1.0\n3,0,100,5,0.7,0.9\n")
    RunRecorder(tmp_path, config, 10, 0.5, rows=[{"round": 1}, {"round": 2}], resumed_after=2)
    with open(tmp_path / CLIENT_EVALUATION_FILE, newline="") as f:
        assert [row[0] for row in csv.reader(f)] == ["round", "1", "2"]
    RunRecorder(tmp_path, config, 10, 0.5)  # a fresh run starts the file afresh
    assert (tmp_path / CLIENT_EVALUATION_FILE).read_text() == "round,partition,node,examples,accuracy,loss\n"
