"""The local training loop and the server's round config."""

from __future__ import annotations

import torch

from clients.models import build_model
from clients.training import LocalTrainingConfig, evaluate, train_local
from partitions import load_dataset
from strategies.server_app import round_train_config
from experiments.launch import default_run_config


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
    config = {**default_run_config(), "lr": 0.01, "lr-decay": 0.99}
    assert round_train_config(config, 1)["lr"] == 0.01
    assert abs(round_train_config(config, 11)["lr"] - 0.01 * 0.99**10) < 1e-15
