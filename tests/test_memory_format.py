"""The memory layout each model trains in (clients/memory_format.py): the measured choice per
model and device, honoured by the client's model and data, off with BASIN_SPEEDUPS=off,
recorded in the run's summary, and the same training within float rounding either way."""

from __future__ import annotations

import pytest
import torch

from clients.arithmetic import arithmetic_record
from clients.client_work import _process_model
from clients.data import client_tensors
from clients.memory_format import CHANNELS_LAST, CHANNELS_LAST_ON, CONV_MODEL_INPUTS, memory_format
from clients.models import MODEL_NAMES, build_model
from clients.training import LocalTrainingConfig, train_local
from experiments.runtime.run_config import resolve_config

# The models that train in channels-last on the CPU, as docs/speed.md's table measured them:
# one switched back (or another switched) without a new measurement fails here.
CPU_CHANNELS_LAST = {"fmnist-cnn", "femnist-cnn", "digit5-cnn", "cifar-cnn", "resnet20-gn", "resnet56", "resnet56-bn",
                     "alexnet-gn"}


def test_the_cpu_layouts_are_the_measured_ones_and_the_models_without_convolutions_keep_the_default():
    assert {model for model, device in CHANNELS_LAST_ON if device == "cpu"} == CPU_CHANNELS_LAST
    assert set(CONV_MODEL_INPUTS) == set(MODEL_NAMES) - {"mlp", "char-lstm"}  # every conv model was measured
    assert memory_format("mlp", "cpu") == torch.contiguous_format  # the main job's digits MLP keeps its bits


@pytest.mark.parametrize("name", sorted(CPU_CHANNELS_LAST))
def test_a_clients_model_is_in_its_layout_unless_speed_ups_are_off(name, monkeypatch):
    layout = memory_format(name, "cpu")
    assert layout == CHANNELS_LAST
    model = _process_model(name, CONV_MODEL_INPUTS[name], 10, False, "cpu", layout)
    convolutions = [m.weight for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convolutions and all(w.is_contiguous(memory_format=CHANNELS_LAST) for w in convolutions)
    monkeypatch.setenv("BASIN_SPEEDUPS", "off")
    assert memory_format(name, "cpu") == torch.contiguous_format


def test_a_clients_images_come_in_the_layout_asked_for(miniature_hub):
    """Three-channel images (one channel's are the same memory in either layout)."""
    config = resolve_config({}, {"dataset": f"hf:{miniature_hub['cifar100']}", "num-clients": 4, "alpha": 1.0})
    x, _, _, _ = client_tensors(tuple(sorted(config.items())), 1, 4, "cpu", CHANNELS_LAST)
    assert x.shape[1] == 3 and x.is_contiguous(memory_format=CHANNELS_LAST) and not x.is_contiguous()
    plain, _, _, _ = client_tensors(tuple(sorted(config.items())), 1, 4, "cpu")
    assert plain.is_contiguous() and torch.equal(plain, x)


def test_the_runs_summary_records_the_evaluations_layout_on_the_servers_device(monkeypatch):
    fmnist = resolve_config({}, {"dataset": "fashion-mnist", "model": "fmnist-cnn"}) | {"data-dir": ""}
    assert arithmetic_record(torch.device("cpu"), fmnist, False)["evaluation-memory-format"] == "channels-last"
    assert arithmetic_record(torch.device("cpu"), resolve_config({}, {}), False)["evaluation-memory-format"] == "contiguous"
    monkeypatch.setenv("BASIN_SPEEDUPS", "off")
    assert arithmetic_record(torch.device("cpu"), fmnist, False)["evaluation-memory-format"] == "contiguous"


def test_the_runs_summary_records_the_clients_layout_as_their_replies_report_it(tmp_path, monkeypatch, server_identity):
    """Clients that train where ResNet-20-GN keeps the default layout (as on CUDA) while the
    ServerApp evaluates on the CPU, in channels-last: summary.json's memory-format is the
    clients' (it was derived from the server's device)."""
    import json

    from clients import client_work
    from experiments.measurement.in_process_grid import InProcessGrid
    from partitions import load_dataset
    from strategies.config import summary_horizon
    from strategies.results import RunRecorder
    from strategies.server_work import train_rounds

    monkeypatch.setattr(client_work, "memory_format", lambda name, device_type: memory_format(name, "cuda"))
    config = resolve_config({}, {"model": "resnet20-gn", "num-clients": 4, "num-rounds": 1, "participation": 0.5,
                                 "checkpoint-every": 0})
    recorder = RunRecorder(tmp_path, config, summary_horizon(config), config["target-accuracy"])
    recorder.describe(arithmetic=arithmetic_record(torch.device("cpu"), config, False))
    train_rounds(InProcessGrid(config, 4), config, recorder, None, load_dataset("digits", "", True), torch.device("cpu"))
    arithmetic = json.loads((tmp_path / "summary.json").read_text())["arithmetic"]
    assert (arithmetic["memory-format"], arithmetic["evaluation-memory-format"]) == ("contiguous", "channels-last")


def test_a_round_in_either_layout_gives_the_same_model_within_float_rounding():
    """Not bitwise: a convolution sums in another order in each layout."""
    shape = CONV_MODEL_INPUTS["fmnist-cnn"]
    data = torch.Generator().manual_seed(0)
    x, y = torch.randn(120, *shape, generator=data), torch.randint(10, (120,), generator=data)
    config = LocalTrainingConfig(lr=0.05, local_epochs=1, batch_size=50, momentum=0.9, weight_decay=1e-3, grad_clip=0.0)
    trained = {}
    for layout in (torch.contiguous_format, CHANNELS_LAST):
        torch.manual_seed(0)
        model = build_model("fmnist-cnn", shape, 10).to(memory_format=layout)
        result = train_local(model, x.contiguous(memory_format=layout), y, config, torch.Generator().manual_seed(1))
        trained[layout] = (result.mean_loss, model.state_dict())
    (plain_loss, plain), (last_loss, last) = trained.values()
    assert last_loss == pytest.approx(plain_loss, rel=1e-5)
    for key in plain:
        torch.testing.assert_close(last[key], plain[key], rtol=1e-4, atol=1e-6)
