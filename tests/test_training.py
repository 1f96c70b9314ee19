"""The local training loop and the server's round config."""

from __future__ import annotations

import torch

from clients.models import build_model
from clients.training import LocalTrainingConfig, add_proximal_gradient, evaluate, proximal_hook, train_local
from experiments.runtime.run_config import resolve_config
from partitions import load_dataset
from strategies.methods.strategy_builder import build_client_schedule
from strategies.server_work import round_train_config


def _train(seed: int, **overrides):
    data = load_dataset("digits")
    torch.manual_seed(0)
    model = build_model("mlp", data.input_shape, 10)
    config = LocalTrainingConfig(**{"lr": 0.05, "local_epochs": 2, "batch_size": 32, "momentum": 0.9, **overrides})
    result = train_local(model, data.x_train[:300], data.y_train[:300], config, torch.Generator().manual_seed(seed))
    return model, result


def test_local_training_learns_and_counts_steps():
    data = load_dataset("digits")
    model, result = _train(0)
    assert result.num_steps == 2 * 10  # 300 samples / batch 32 → 10 batches per epoch
    assert result.num_examples == 300
    loss, accuracy = evaluate(model, data.x_test, data.y_test)
    assert accuracy > 0.6 and loss < 1.5


def test_local_training_is_deterministic_given_the_generator():
    a, _ = _train(7)
    b, _ = _train(7)
    c, _ = _train(8)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    assert not all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), c.state_dict().values()))


def test_gradient_clipping_bounds_the_first_step():
    data = load_dataset("digits")
    torch.manual_seed(0)
    model = build_model("mlp", data.input_shape, 10)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    config = LocalTrainingConfig(lr=1.0, local_epochs=1, batch_size=len(data.y_train), grad_clip=0.01)
    train_local(model, data.x_train, data.y_train, config, torch.Generator().manual_seed(0))
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    # One full-batch SGD step of lr 1 with a gradient clipped to norm 0.01.
    assert torch.linalg.vector_norm(after - before) <= 0.01 + 1e-6


def test_round_lr_follows_exponential_decay():
    config = resolve_config({"lr": 0.01, "lr-decay": 0.99})
    schedule = build_client_schedule(config)
    assert round_train_config(config, schedule, 1)["lr"] == 0.01
    assert abs(round_train_config(config, schedule, 11)["lr"] - 0.01 * 0.99**10) < 1e-15


def test_proximal_gradient_by_hand():
    w = torch.nn.Parameter(torch.tensor([2.0, 3.0]))
    w.grad = torch.tensor([1.0, 1.0])
    add_proximal_gradient([w], [torch.tensor([1.0, 1.0])], mu=0.5)
    # g + μ(w − w^t) = [1 + 0.5·1, 1 + 0.5·2]
    assert w.grad.tolist() == [1.5, 2.0]


def test_fedprox_keeps_clients_closer_to_the_global_model():
    def drift(mu):
        data = load_dataset("digits")
        torch.manual_seed(0)
        model = build_model("mlp", data.input_shape, 10)
        start = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
        config = LocalTrainingConfig(lr=0.05, local_epochs=3, batch_size=32)
        hooks = [proximal_hook(model, mu)] if mu else []
        train_local(model, data.x_train[:200], data.y_train[:200], config, torch.Generator().manual_seed(0), hooks)
        return float(torch.linalg.vector_norm(torch.cat([p.detach().flatten() for p in model.parameters()]) - start))

    assert drift(1.0) < drift(0.0)


def test_partition_statistics_are_written_beside_the_rounds_and_a_failed_table_fails_the_run(tmp_path):
    """partition.csv and partition.png come from a thread (at 10⁶ clients ~20 s that used to
    delay round 1); writing the table can fail (a full disk): the ServerApp then raises it."""
    from types import SimpleNamespace

    import numpy as np
    import pandas as pd
    import pytest
    import torch

    from strategies.server_work import PartitionStatistics

    data = SimpleNamespace(y_train=torch.tensor([0, 1, 1, 2, 2, 2]), num_classes=3, columns={}, domain_names=())
    indices = (np.array([0, 1]), np.array([2, 3, 4, 5]))
    statistics = PartitionStatistics(data, indices, tmp_path, "title")
    statistics.start()
    statistics.finish()
    table = pd.read_csv(tmp_path / "partition.csv", index_col=0)
    assert table[["class-0", "class-1", "class-2"]].values.tolist() == [[1, 1, 0], [0, 1, 3]]
    assert (tmp_path / "partition.png").stat().st_size > 1000
    failing = PartitionStatistics(data, indices, tmp_path / "missing", "title")
    failing.start()
    with pytest.raises(OSError):
        failing.finish()


def test_partition_statistics_start_when_training_starts_and_are_written_however_the_run_ends(tmp_path, monkeypatch):
    """At 10⁶ clients counting and drawing take ~20 s of the ServerApp process's interpreter,
    which the simulation engine needs before round 1 (it registers the nodes, starts Ray):
    the thread starts once train_rounds says training starts, and a run that ends before
    that still gets its partition.csv and partition.png."""
    from types import SimpleNamespace

    import pytest

    from strategies import server_work

    config = resolve_config({"num-clients": 4, "num-rounds": 1})
    recorder = SimpleNamespace(directory=tmp_path, describe=lambda **record: None)
    seen = []

    def train_rounds(grid, config, recorder, checkpoint, data, device, on_training_start):
        seen.append((tmp_path / "partition.csv").exists())
        on_training_start()

    monkeypatch.setattr(server_work, "train_rounds", train_rounds)
    server_work.run(None, config, recorder)
    assert seen == [False]
    assert (tmp_path / "partition.csv").exists() and (tmp_path / "partition.png").stat().st_size > 1000

    def discovery_fails(grid, config, recorder, checkpoint, data, device, on_training_start):
        raise RuntimeError("no clients")

    monkeypatch.setattr(server_work, "train_rounds", discovery_fails)
    (tmp_path / "partition.csv").unlink()
    with pytest.raises(RuntimeError, match="no clients"):
        server_work.run(None, config, recorder)
    assert (tmp_path / "partition.csv").exists()
