"""The GroupNorm model zoo of METHODS.md §4: parameter counts from hand formulas, shapes,
stage outputs, width slimming with shared weights, stochastic depth."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from clients.models import MODEL_NAMES, SLIMMABLE_MODELS, build_model, is_slimmable, uses_projection_head
from clients.models.slimmable import SlimConv2d, SlimLinear, sliced_channels, slimmable_width


def conv3(i: int, o: int, bias: bool = False) -> int:
    return 9 * i * o + (o if bias else 0)


def conv1(i: int, o: int) -> int:
    return i * o


def gn(c: int) -> int:  # GroupNorm affine: a scale and a shift per channel (as BatchNorm's)
    return 2 * c


def fc(i: int, o: int) -> int:
    return i * o + o


def basic(i: int, o: int, projection: bool) -> int:
    shortcut = conv1(i, o) + gn(o) if projection else 0
    return conv3(i, o) + gn(o) + conv3(o, o) + gn(o) + shortcut


def bottleneck(i: int, planes: int, projection: bool) -> int:
    out = 4 * planes
    shortcut = conv1(i, out) + gn(out) if projection else 0
    return conv1(i, planes) + gn(planes) + conv3(planes, planes) + gn(planes) + conv1(planes, out) + gn(out) + shortcut


def resnet20_parameters(classes: int) -> int:
    # Option A shortcuts have no parameters.
    stem = conv3(3, 16) + gn(16)
    stages = (
        3 * basic(16, 16, False)
        + basic(16, 32, False) + 2 * basic(32, 32, False)
        + basic(32, 64, False) + 2 * basic(64, 64, False)
    )
    return stem + stages + fc(64, classes)


def resnet56_parameters(classes: int) -> int:
    stem = conv3(3, 16) + gn(16)
    stages = (
        bottleneck(16, 16, True) + 5 * bottleneck(64, 16, False)
        + bottleneck(64, 32, True) + 5 * bottleneck(128, 32, False)
        + bottleneck(128, 64, True) + 5 * bottleneck(256, 64, False)
    )
    return stem + stages + fc(256, classes)


def resnet18_backbone_parameters() -> int:
    stem = conv3(3, 64) + gn(64)
    stages = (
        2 * basic(64, 64, False)
        + basic(64, 128, True) + basic(128, 128, False)
        + basic(128, 256, True) + basic(256, 256, False)
        + basic(256, 512, True) + basic(512, 512, False)
    )
    return stem + stages


def vgg11_parameters(classes: int) -> int:
    widths = [(3, 64), (64, 128), (128, 256), (256, 256), (256, 512), (512, 512), (512, 512), (512, 512)]
    convs = sum(conv3(i, o, bias=True) + gn(o) for i, o in widths)
    return convs + fc(512, 128) + fc(128, classes)


def test_hand_formulas_reproduce_the_well_known_figures():
    # kuangliu's CIFAR ResNet-18 (BatchNorm, fc 512→10): 11,173,962 parameters.
    assert resnet18_backbone_parameters() + fc(512, 10) == 11_173_962
    # The often quoted 272,474 for ResNet-20 counts 1×1 projection shortcuts (+ norm) in the
    # two down-sampling blocks; option A (ours, He et al.'s CIFAR choice) has none.
    assert resnet20_parameters(10) + conv1(16, 32) + gn(32) + conv1(32, 64) + gn(64) == 272_474


def trained_like(model: torch.nn.Module) -> torch.nn.Module:
    """Residual branches start switched off (last GN weight 0); switch them on, as after
    some training, so that outputs and gradients go through every layer."""
    for block in model.residual_blocks():
        torch.nn.init.ones_(block.last_norm.weight)
    return model


def test_residual_branches_start_switched_off():
    torch.manual_seed(0)
    model = build_model("resnet20-gn", (3, 32, 32), 10)
    assert all(float(block.last_norm.weight.abs().sum()) == 0.0 for block in model.residual_blocks())


@pytest.mark.parametrize("classes", [10, 100])
@pytest.mark.parametrize(
    "name, expected",
    [
        ("resnet20-gn", resnet20_parameters),
        ("resnet56", resnet56_parameters),
        ("resnet56-bn", resnet56_parameters),  # BN has GN's weight and bias per channel
        # kuangliu's 11,173,962 − fc(512,10) + head fc(512,128) + classifier fc(128,C)
        ("resnet18-gn", lambda c: 11_173_962 - fc(512, 10) + fc(512, 128) + fc(128, c)),
        # FedSWA's models/resnet_bn.py (kuangliu's ResNet-18): the 512 features straight to fc(512, C)
        ("resnet18-bn", lambda c: 11_173_962 - fc(512, 10) + fc(512, c)),
        ("vgg11-gn", vgg11_parameters),
    ],
)
def test_the_resnets_have_the_reference_codes_parameter_counts(name, expected, classes):
    model = build_model(name, (3, 32, 32), classes)
    assert sum(p.numel() for p in model.parameters()) == expected(classes)


@pytest.mark.parametrize("name", ["resnet56", "resnet56-bn"])
def test_moons_projection_head_on_resnet56_adds_two_256_wide_layers(name):
    # FedAlign's code: p1 = Linear(256, 256), ReLU, p2 = Linear(256, 256), then fc(256, C).
    model = build_model(name, (3, 32, 32), 100, projection_head=True)
    assert sum(p.numel() for p in model.parameters()) == resnet56_parameters(100) + 2 * fc(256, 256)
    assert model.represent(torch.randn(2, 3, 32, 32)).shape == (2, 256)
    assert uses_projection_head(name, "moon") and not uses_projection_head(name, "fedavg")
    assert not uses_projection_head("resnet18-gn", "moon")  # its MLP head is the projection already
    with pytest.raises(ValueError, match="projection-head"):
        build_model("resnet18-gn", (3, 32, 32), 10, projection_head=True)


def test_resnet56_bn_keeps_float_running_statistics_of_the_full_width_only():
    torch.manual_seed(0)
    model = build_model("resnet56-bn", (3, 32, 32), 100)
    state = model.state_dict()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    # running mean and var per channel of every BN, nothing else (no integer batch counter).
    buffers = sum(t.numel() for k, t in state.items() if "running" in k)
    assert buffers == 2 * sum(m.num_features for m in norms)
    assert all(t.is_floating_point() for t in state.values())
    # Not zero-initialised (the authors' zero_init_residual=False): every branch is on.
    assert all(float(block.last_norm.weight.min()) == 1.0 for block in model.residual_blocks())
    model.train()
    last = model.stages[-1]
    before = {k: v.clone() for k, v in last.state_dict().items()}
    f = torch.randn(4, 128, 16, 16)
    with slimmable_width(last, 0.25):
        last(f[:, :32])  # the slim pass: batch statistics, nothing stored
    assert all(torch.equal(before[k], v) for k, v in last.state_dict().items())
    last(f)  # the full pass updates the running statistics
    assert not torch.equal(before["0.gn1.running_mean"], last.state_dict()["0.gn1.running_mean"])
    model.eval()  # evaluation at a reduced width still normalises with the batch's statistics
    with slimmable_width(last, 0.25):
        out = last[0].gn1(torch.randn(4, 16, 8, 8) * 5 + 3)
    assert abs(float(out.mean())) < 1e-5


# An input shape each model takes (the others: 3×32×32); char-lstm reads 12 character ids.
INPUT_SHAPES = {"mlp": (1, 8, 8), "fmnist-cnn": (1, 28, 28), "femnist-cnn": (1, 28, 28), "digit5-cnn": (3, 28, 28),
                "alexnet-gn": (3, 64, 64), "char-lstm": (12,)}


def example_input(name: str) -> torch.Tensor:
    shape = INPUT_SHAPES.get(name, (3, 32, 32))
    return torch.randint(0, 10, (2, *shape)) if name == "char-lstm" else torch.randn(2, *shape)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_classifier_on_the_representation_is_the_forward(name):
    torch.manual_seed(0)
    x = example_input(name)
    model = build_model(name, tuple(x.shape[1:]), 10)
    model.eval()  # FEMNIST's dropout
    representation = model.represent(x)
    assert representation.shape[-1] == model.classifier.in_features
    logits = model.classifier(representation)
    # Sequence models score every position: (N, T, classes) → (N, classes, T).
    torch.testing.assert_close(logits.transpose(1, 2) if logits.dim() == 3 else logits, model(x))
    assert is_slimmable(model) == (name in SLIMMABLE_MODELS)


@pytest.mark.parametrize("name", ["resnet20-gn", "resnet56", "resnet18-gn", "vgg11-gn"])
def test_shapes_on_cifar_and_digit_inputs(name):
    model = build_model(name, (3, 32, 32), 100)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 100)
    small = build_model(name, (1, 8, 8), 10)
    assert small(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_inputs_below_8x8_are_refused():
    with pytest.raises(ValueError, match="H, W >= 8"):
        build_model("resnet20-gn", (1, 7, 8), 10)


@pytest.mark.parametrize("name, stages, blocks", [("resnet20-gn", 3, 9), ("resnet56", 3, 18), ("resnet18-gn", 4, 8)])
def test_forward_stages_gives_each_stages_output_and_the_logits_of_forward(name, stages, blocks):
    torch.manual_seed(0)
    model = build_model(name, (3, 32, 32), 10)
    x = torch.randn(2, 3, 32, 32)
    outputs, logits = model.forward_stages(x)
    assert len(outputs) == len(model.stages) == stages and len(model.residual_blocks()) == blocks
    torch.testing.assert_close(logits, model(x))
    torch.testing.assert_close(model.logits_from_last_stage(outputs[-1]), logits)


def test_sliced_channels_stay_even_for_groupnorm():
    assert [sliced_channels(c, 0.25) for c in (16, 32, 64, 128, 256, 512)] == [4, 8, 16, 32, 64, 128]
    assert sliced_channels(16, 0.8) == 14  # ceil(12.8) = 13, rounded up to even
    assert sliced_channels(30, 0.1) == 4  # 0.1·30 is 3.0000000000000004 in floats: ceil gives 3, even 4
    assert sliced_channels(16, 1.0) == 16


def test_slim_layers_use_the_first_channels_of_the_full_weights():
    torch.manual_seed(0)
    conv, fixed = SlimConv2d(8, 8, 3, padding=1), SlimConv2d(8, 6, 3, padding=1, fixed_out=True)
    x = torch.randn(2, 8, 5, 5)
    x_zeroed = torch.cat([x[:, :4], torch.zeros_like(x[:, 4:])], dim=1)
    with slimmable_width(conv, 0.5), slimmable_width(fixed, 0.5):
        slim, kept = conv(x[:, :4]), fixed(x[:, :4])
    torch.testing.assert_close(slim, conv(x_zeroed)[:, :4])
    torch.testing.assert_close(kept, fixed(x_zeroed))
    linear = SlimLinear(8, 3)
    torch.testing.assert_close(linear(x[:, :4, 0, 0]), linear(x_zeroed[:, :, 0, 0]))
    with pytest.raises(ValueError, match="width"):
        with slimmable_width(conv, 0.0):
            pass


@pytest.mark.parametrize("name, full, slim", [("resnet20-gn", 64, 16), ("resnet56", 256, 64), ("resnet18-gn", 512, 128)])
def test_slim_last_stage_shares_the_full_weights(name, full, slim):
    torch.manual_seed(0)
    model = trained_like(build_model(name, (3, 32, 32), 10))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        outputs, logits = model.forward_stages(x)
    before = outputs[-2]
    assert outputs[-1].shape[1] == full
    parameters = [(p, p.data_ptr()) for p in model.parameters()]
    stage = model.stages[-1]
    with slimmable_width(stage, 0.25):
        slim_out = stage(before[:, : math.ceil(0.25 * before.shape[1])])
    assert slim_out.shape[1] == slim
    slim_out.square().sum().backward()

    assert all(p is q and p.data_ptr() == ptr for p, (q, ptr) in zip(model.parameters(), parameters, strict=True))
    convs = [m for m in stage.modules() if isinstance(m, SlimConv2d)]
    assert convs and all(conv.width == 1.0 for conv in convs)
    for conv in convs:
        out, in_ = sliced_channels(conv.out_channels, 0.25), sliced_channels(conv.in_channels, 0.25)
        grad = conv.weight.grad
        assert grad.shape == conv.weight.shape
        assert grad[:out, :in_].abs().sum() > 0
        assert not grad[out:].any() and not grad[:, in_:].any()
    # Only the last stage ran: no gradient elsewhere.
    assert all(p.grad is None for p in model.stem.parameters())

    with torch.no_grad():
        again, logits_again = model.forward_stages(x)
    torch.testing.assert_close(again[-1], outputs[-1])
    torch.testing.assert_close(logits_again, logits)


@pytest.mark.parametrize("name, full", [("resnet20-gn", 64), ("resnet56", 256), ("resnet18-gn", 512)])
def test_whole_network_runs_slim(name, full):
    assert name in SLIMMABLE_MODELS
    model = build_model(name, (3, 32, 32), 100)
    with slimmable_width(model, 0.8):
        outputs, logits = model.forward_stages(torch.randn(2, 3, 32, 32))
    assert logits.shape == (2, 100)
    assert outputs[-1].shape[1] == sliced_channels(full, 0.8) < full


def test_dropped_residual_branches_leave_the_shortcut_in_training_and_none_drop_in_evaluation():
    torch.manual_seed(0)
    model = trained_like(build_model("resnet20-gn", (3, 32, 32), 10))
    x = torch.randn(4, 3, 32, 32)
    reference = model(x)  # GroupNorm keeps no statistics: train and eval agree without drops
    for block in model.residual_blocks():
        block.drop_rate = 0.5
    model.eval()
    torch.testing.assert_close(model(x), reference)  # surviving branches are scaled in training only
    model.train()
    torch.manual_seed(1)
    assert any(not torch.allclose(model(x), reference) for _ in range(3))

    # drop_rate 1 removes every branch: each block is relu(shortcut(x)).
    for block in model.residual_blocks():
        block.drop_rate = 1.0
    out = model.stem(x)
    for block in model.residual_blocks():
        if block.zero_pad:
            out = F.pad(out[:, :, ::2, ::2], (0, 0, 0, 0, out.shape[1] // 2, out.shape[1] // 2))
        out = F.relu(out)
    torch.testing.assert_close(model(x), model.logits_from_last_stage(out))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_weights_round_trip_through_a_flower_array_record(name):
    # What every round does: state dict → ArrayRecord → state dict → load_state_dict (strict).
    from flwr.app import ArrayRecord

    shape = tuple(example_input(name).shape[1:])
    torch.manual_seed(0)
    source, target = build_model(name, shape, 10), build_model(name, shape, 10)
    target.load_state_dict(ArrayRecord(source.state_dict()).to_torch_state_dict())
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))


def test_the_models_with_buffers_are_exactly_those_declared_and_their_counterparts_have_none():
    """Server-side DP refuses a model with buffers by clients/model_names.GROUP_NORM_COUNTERPART;
    every built-in model is built here so that the declaration cannot drift from the code."""
    from clients.model_names import GROUP_NORM_COUNTERPART, REQUIRED_INPUT

    with_buffers = set()
    for name in MODEL_NAMES:
        shape = (80,) if name == "char-lstm" else REQUIRED_INPUT.get(name, (3, 32, 32))
        if any(True for _ in build_model(name, shape, 10).buffers()):
            with_buffers.add(name)
    assert with_buffers == set(GROUP_NORM_COUNTERPART)
    assert not with_buffers & set(GROUP_NORM_COUNTERPART.values())
