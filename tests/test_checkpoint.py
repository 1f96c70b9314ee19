"""Checkpoints: written atomically, loaded with weights_only, refused when corrupt or foreign."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from experiments.runtime.run_config import resolve_config
from strategies.averaging import ModelAveraging
from strategies.checkpoint import (
    CHECKPOINT_FILE,
    CheckpointError,
    read_checkpoint,
    restore_checkpoint,
    write_checkpoint,
)
from strategies.fedavg import FedAvg
from strategies.results import RunRecorder


def _strategy():
    base = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=0, min_available_nodes=0)
    return ModelAveraging(base, window=2, start_round=1, feedback=True)


def _config(**overrides):
    return resolve_config({"num-rounds": 6, **overrides})


def _checkpointed(tmp_path, config):
    strategy = _strategy()
    strategy.recent_models.extend([{"w": np.array([1.0, 2.0])}, {"w": np.array([3.0, 4.0])}])
    strategy.base_arrays = ArrayRecord({"w": Array(np.array([3.0, 4.0]))})
    strategy.averaged_arrays = ArrayRecord({"w": Array(np.array([2.0, 3.0]))})
    rows = [{"round": 1, "test-accuracy": 0.5, "failures": ""}, {"round": 2, "test-accuracy": 0.625, "failures": "p 1"}]
    write_checkpoint(tmp_path, config, 2, strategy.averaged_arrays, strategy, rows, "0123abcd")
    return strategy, rows


def test_a_checkpoint_restores_model_window_rows_and_generators(tmp_path):
    config = _config()
    torch.manual_seed(3), np.random.seed(4), random.seed(5)
    _, rows = _checkpointed(tmp_path, config)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(0), np.random.seed(0), random.seed(0)

    payload = torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)  # loads without unpickling code
    assert payload["round"] == 2
    checkpoint = read_checkpoint(tmp_path, config)
    restored = _strategy()
    arrays, first_round = restore_checkpoint(checkpoint, restored)
    assert first_round == 3 and arrays["w"].numpy().tolist() == [2.0, 3.0]
    assert [m["w"].tolist() for m in restored.recent_models] == [[1.0, 2.0], [3.0, 4.0]]
    assert restored.averaged_arrays["w"].numpy().tolist() == [2.0, 3.0]
    assert checkpoint["rows"] == rows and checkpoint["client-state-run"] == "0123abcd"
    assert torch.equal(torch.rand(3), expected[0]) and np.array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]
    assert not (tmp_path / (CHECKPOINT_FILE + ".tmp")).exists()


def test_no_checkpoint_or_resume_off_starts_fresh(tmp_path):
    assert read_checkpoint(tmp_path, _config()) is None
    _checkpointed(tmp_path, _config())
    assert read_checkpoint(tmp_path, _config(resume=False)) is None


def test_settings_that_do_not_change_the_numbers_may_change_on_resume(tmp_path):
    _checkpointed(tmp_path, _config())
    assert read_checkpoint(tmp_path, _config(**{"round-timeout": 30.0, "checkpoint-every": 1, "output-dir": "/x"}))


def test_a_checkpoint_of_another_config_is_refused_naming_the_key(tmp_path):
    _checkpointed(tmp_path, _config())
    with pytest.raises(CheckpointError, match=r"another config \(lr = 0.05 there but 0.1 here\).*resume = false"):
        read_checkpoint(tmp_path, _config(lr=0.1))


def test_a_corrupt_checkpoint_is_refused(tmp_path):
    _checkpointed(tmp_path, _config())
    path = tmp_path / CHECKPOINT_FILE
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="corrupt or not a Basin checkpoint"):
        read_checkpoint(tmp_path, _config())
    torch.save({"round": 2}, path)
    with pytest.raises(CheckpointError, match="lacks arrays, client-state-run, config, format, rng, rows, strategy"):
        read_checkpoint(tmp_path, _config())


def test_a_resumed_recorder_rewrites_results_up_to_the_checkpoint(tmp_path):
    (tmp_path / "results.csv").write_text("stale rows of rounds after the checkpoint\n")
    recorder = RunRecorder(tmp_path, {}, last_k=2, target=0.6, rows=[{"round": 1, "test-accuracy": 0.5}], resumed_after=1)
    recorder.append({"round": 2, "test-accuracy": 0.7})
    lines = (tmp_path / "results.csv").read_text().splitlines()
    assert len(lines) == 3 and lines[1].startswith("1,") and lines[2].startswith("2,")
    assert recorder.complete()["resumed-after-round"] == 1 and recorder.complete()["rounds-to-target"] == 2


def _tampered(tmp_path, **changes):
    from strategies.checkpoint import load_checkpoint, save_checkpoint

    path = tmp_path / CHECKPOINT_FILE
    save_checkpoint(path, {**load_checkpoint(path), **changes})


def test_a_checkpoint_of_another_format_is_refused(tmp_path):
    _checkpointed(tmp_path, _config())
    _tampered(tmp_path, format=1)
    with pytest.raises(CheckpointError, match=r"format 1, expected 2; delete it, or set resume = false"):
        read_checkpoint(tmp_path, _config())


@pytest.mark.parametrize("server_round", [0, 7])
def test_a_checkpoint_of_a_round_the_run_does_not_have_is_refused(tmp_path, server_round):
    _checkpointed(tmp_path, _config())
    _tampered(tmp_path, round=server_round)
    with pytest.raises(CheckpointError, match=rf"round {server_round} is outside 1\.\.6"):
        read_checkpoint(tmp_path, _config())
