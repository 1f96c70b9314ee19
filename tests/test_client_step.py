"""The local step (clients/client_step.py): the static-buffer step is bitwise the eager
one on the CPU, across rounds whose gradient terms change; which steps are captured on
CUDA; and, on a GPU, graph replay against eager steps."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from clients.client_step import GradientTerm, step_mode
from clients.control_variates import add_correction
from clients.models import build_model
from clients.objectives.gradaug import GradAug
from clients.objectives.moon import Moon
from clients.training import CrossEntropy, LocalObjective, LocalTrainingConfig, proximal_hook, train_local

CUDA = torch.device("cuda")


def rounds_of_training(model: nn.Module, mode: str, config: LocalTrainingConfig, x, y, rounds: int = 3,
                       post_clip: bool = False) -> list[tuple[float, list[torch.Tensor]]]:
    """``rounds`` rounds as a client lives them: FedProx anchored at the round's start and
    a SCAFFOLD-like correction that changes every round; returns (loss, weights) per round."""
    results = []
    for server_round in range(rounds):
        corrections = [torch.full_like(p, 0.01 * (server_round + 1)) for p in model.parameters()]
        terms = [proximal_hook(model, 0.1)]
        other = [GradientTerm("control variate", add_correction, corrections)]
        generator = torch.Generator().manual_seed(server_round)
        round_config = LocalTrainingConfig(**{**config.__dict__, "lr": config.lr * 0.9**server_round})
        result = train_local(model, x, y, round_config, generator, terms + ([] if post_clip else other),
                             post_clip_hooks=other if post_clip else (), mode=mode)
        results.append((result.mean_loss, [p.detach().clone() for p in model.parameters()]))
    return results


@pytest.mark.parametrize("momentum, nesterov, grad_clip, post_clip", [
    (0.0, False, 0.0, False), (0.9, False, 1.0, False), (0.9, True, 0.0, True),
])
def test_the_static_buffer_step_is_bitwise_the_eager_step_on_cpu(momentum, nesterov, grad_clip, post_clip):
    torch.manual_seed(0)
    x, y = torch.randn(70, 1, 8, 8), torch.randint(0, 10, (70,))  # 70 = 2 × 32 + a short batch of 6
    config = LocalTrainingConfig(lr=0.05, local_epochs=2, batch_size=32, momentum=momentum, weight_decay=1e-3,
                                 grad_clip=grad_clip, nesterov=nesterov, step_lr_start=1.0, step_lr_end=0.1)
    model = build_model("mlp", (1, 8, 8), 10)
    eager = rounds_of_training(copy.deepcopy(model), "eager", config, x, y, post_clip=post_clip)
    static = rounds_of_training(copy.deepcopy(model), "static", config, x, y, post_clip=post_clip)
    for (eager_loss, eager_weights), (static_loss, static_weights) in zip(eager, static):
        assert eager_loss == static_loss
        assert all(torch.equal(a, b) for a, b in zip(eager_weights, static_weights))
    # The rounds did move the model, and differently each round (the terms changed).
    assert not torch.equal(eager[0][1][0], eager[2][1][0])


def test_a_static_step_needs_static_gradient_terms():
    model = build_model("mlp", (1, 8, 8), 10)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    config = LocalTrainingConfig(lr=0.1, local_epochs=1, batch_size=4)
    with pytest.raises(ValueError, match="GradientTerm"):
        train_local(model, x, y, config, torch.Generator(), [lambda params: None], mode="static")


def test_which_steps_are_captured_on_cuda():
    model = build_model("mlp", (1, 8, 8), 10)
    term = proximal_hook(model, 0.01)
    assert step_mode(torch.device("cpu"), True, CrossEntropy(), [term]) == ("eager", "not on CUDA")
    assert step_mode(CUDA, True, CrossEntropy(), [term]) == ("graph", "")
    assert step_mode(CUDA, False, CrossEntropy(), [])[1] == "cuda-graphs = false"
    assert step_mode(CUDA, True, Moon.__new__(Moon), []) == ("graph", "")
    why = step_mode(CUDA, True, GradAug(2, 0.8, 1.75, np.random.default_rng(0)), [])[1]
    assert "GradAug" in why and "widths" in why
    assert "static inputs" in step_mode(CUDA, True, CrossEntropy(), [lambda params: None])[1]

    class Declared(LocalObjective):
        capturable = True

    class Inherited(LocalObjective):
        pass

    class ChangedStep(CrossEntropy):  # a capturable objective's subclass does not inherit the claim
        def backward(self, model, x, y):
            return super().backward(model, x, y)

    # What each class says is what step_mode reads: the base claims nothing.
    assert (Declared.capturable, Inherited.capturable, ChangedStep.capturable) == (True, False, False)
    assert (LocalObjective.capturable, CrossEntropy.capturable) == (False, True)
    assert step_mode(CUDA, True, LocalObjective(), [])[0] == "eager"


def _replay_follows_eager(device: torch.device, rounds: int) -> None:
    """The gpu test's check: Fashion-MNIST's CNN with FedProx, momentum and a short batch
    per epoch, ``rounds`` rounds of 60 steps: no step fell back to eager steps (Basin's own
    record, not a log stream) and the replayed graph follows the eager steps within float32
    rounding (cuDNN may pick other kernels in a captured stream)."""
    from clients import client_step

    client_step._GRAPH_FALLBACKS.clear()
    torch.manual_seed(0)
    x, y = torch.randn(590, 1, 28, 28, device=device), torch.randint(0, 10, (590,), device=device)
    config = LocalTrainingConfig(lr=0.02, local_epochs=5, batch_size=50, momentum=0.9, weight_decay=1e-3)
    model = build_model("fmnist-cnn", (1, 28, 28), 10).to(device)
    eager = rounds_of_training(copy.deepcopy(model), "eager", config, x, y, rounds=rounds)
    graph = rounds_of_training(copy.deepcopy(model), "graph", config, x, y, rounds=rounds)
    assert not client_step.graph_fallbacks(), f"the graph run fell back to eager steps: {client_step.graph_fallbacks()}"
    for (eager_loss, eager_weights), (graph_loss, graph_weights) in zip(eager, graph):
        assert graph_loss == pytest.approx(eager_loss, rel=1e-3)
        for a, b in zip(eager_weights, graph_weights):
            torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_replay_matches_eager_steps_on_cuda(monkeypatch):
    from clients import client_step

    monkeypatch.setattr(client_step, "_GRAPH_FALLBACKS", {})
    _replay_follows_eager(CUDA, rounds=5)


def test_the_replay_check_fails_when_the_graph_falls_back(monkeypatch):
    """On the CPU a forced graph step's capture fails and falls back to eager results: the
    gpu test's check must fail, not pass on the eager numbers."""
    from clients import client_step

    monkeypatch.setattr(client_step, "_GRAPH_FALLBACKS", {})
    monkeypatch.setattr(client_step, "_PROCESS_STEPS", {})
    with pytest.raises(AssertionError, match="the graph run fell back to eager steps"):
        _replay_follows_eager(torch.device("cpu"), rounds=1)


class ReplayingGraph:
    """A stand-in for a captured CUDA graph on the CPU: its replay runs the step's body on
    the static buffers (what a faithful graph does), plus ``error`` on the first weight."""

    def __init__(self, step, error: float = 0.0):
        self.step, self.error = step, error

    def replay(self) -> None:
        self.step.optimizer.zero_grad(set_to_none=False)
        self.step._body(self.step.static_inputs)
        with torch.no_grad():
            self.step.params[0].view(-1)[0] += self.error


def _graph_training(monkeypatch, capture) -> list[tuple[float, list[torch.Tensor]]]:
    """Three rounds in forced graph mode on the CPU with ``capture`` as ClientStep._capture,
    and the same rounds eagerly; returns both."""
    from clients import client_step

    monkeypatch.setattr(client_step, "_GRAPH_FALLBACKS", {})
    monkeypatch.setattr(client_step, "_PROCESS_STEPS", {})
    monkeypatch.setattr(client_step.ClientStep, "_capture", capture)
    torch.manual_seed(0)
    x, y = torch.randn(70, 1, 8, 8), torch.randint(0, 10, (70,))
    config = LocalTrainingConfig(lr=0.05, local_epochs=2, batch_size=16, momentum=0.9, weight_decay=1e-3)
    model = build_model("mlp", (1, 8, 8), 10)
    return (rounds_of_training(copy.deepcopy(model), "graph", config, x, y),
            rounds_of_training(copy.deepcopy(model), "eager", config, x, y))


def _assert_same_training(graph, eager) -> None:
    for (graph_loss, graph_weights), (eager_loss, eager_weights) in zip(graph, eager):
        assert graph_loss == eager_loss
        assert all(torch.equal(a, b) for a, b in zip(graph_weights, eager_weights))


def test_a_capture_that_raises_falls_back_to_eager_steps_once_with_the_eager_results(monkeypatch, capsys):
    from clients import client_step

    captures = []

    def failing_capture(step):
        captures.append(step)
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    graph, eager = _graph_training(monkeypatch, failing_capture)
    _assert_same_training(graph, eager)
    assert len(captures) == 1  # never tried again in this process
    out = capsys.readouterr().err
    assert out.count("CUDA graphs off for this step (CrossEntropy objective, Mlp") == 1
    assert "capture failed (RuntimeError: CUDA error: operation not permitted" in out
    assert client_step.graph_fallbacks() == ["capture failed (RuntimeError: CUDA error: operation not permitted when "
                                             "stream is capturing)"]
    # The failure is kept to its step signature: another model of the process is still captured.
    monkeypatch.setattr(client_step, "step_mode", lambda *args: ("graph", ""))
    config = LocalTrainingConfig(lr=0.1, local_epochs=1, batch_size=4)
    example = (torch.zeros(4, 1, 8, 8), torch.zeros(4, dtype=torch.long))
    other = client_step.client_step(build_model("resnet20-gn", (1, 8, 8), 10), config, CrossEntropy(), [], [], example,
                                    graphs=True)
    assert other.mode == "graph"
    for _ in range(client_step.WARMUP_STEPS + 1):  # its capture fails too (the failing capture is in place)
        other.run(*example, lr=0.1)
    assert len(captures) == 2 and other.mode == "static" and len(client_step.graph_fallbacks()) == 2
    client_step._PROCESS_STEPS.clear()  # a new step object of a failed signature is not captured again
    again = client_step.client_step(other.model, config, CrossEntropy(), [], [], example, graphs=True)
    assert again.key == other.key and again.mode == "static"


def test_a_first_replay_that_differs_from_the_eager_step_falls_back_with_the_eager_results(monkeypatch, capsys):
    def wrong_graph(step):
        step.graph = ReplayingGraph(step, error=0.5)

    graph, eager = _graph_training(monkeypatch, wrong_graph)
    _assert_same_training(graph, eager)
    out = capsys.readouterr().err
    assert out.count("CUDA graphs off for this step") == 1
    assert "the first replay differs from the eager step (in 1 of" in out


def test_a_faithful_replay_is_kept(monkeypatch, capsys):
    replays = []

    def faithful_graph(step):
        step.graph = ReplayingGraph(step)
        replays.append(step.graph)

    graph, eager = _graph_training(monkeypatch, faithful_graph)
    _assert_same_training(graph, eager)
    assert len(replays) == 1 and "CUDA graphs off" not in capsys.readouterr().err


@pytest.mark.parametrize("momentum, nesterov, weight_decay", [(0.0, False, 0.0), (0.9, False, 5e-4), (0.5, True, 1e-3)])
def test_the_local_sgd_is_bitwise_torch_optim_sgd_fused(momentum, nesterov, weight_decay):
    """clients/sgd.py makes torch.optim.SGD(fused=True)'s update, parameters and momentum
    buffers bit for bit, over steps whose learning rate changes and a gradient set to None."""
    from clients.sgd import FusedSgd

    torch.manual_seed(0)
    ours = [nn.Parameter(torch.randn(5, 3)), nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(4, dtype=torch.float64))]
    theirs = [nn.Parameter(p.detach().clone()) for p in ours]
    lr_ours, lr_theirs = torch.zeros(()), torch.zeros(())
    sgd = FusedSgd(ours, lr_ours, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    reference = torch.optim.SGD(theirs, lr=lr_theirs, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                                fused=True)
    for step, lr in enumerate([0.1, 0.05, 0.2, 0.01]):
        grads = [torch.randn_like(p) for p in ours]
        for mine, reference_param, grad in zip(ours, theirs, grads):
            mine.grad, reference_param.grad = grad.clone(), grad.clone()
        lr_ours.fill_(lr)
        lr_theirs.fill_(lr)
        sgd.step()
        reference.step()
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs)), f"parameters differ after step {step}"
        buffers = [reference.state[p].get("momentum_buffer") for p in theirs]
        assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(sgd.momentum_buffers, buffers))
        sgd.zero_grad(set_to_none=step % 2 == 0)
        reference.zero_grad(set_to_none=step % 2 == 0)
        assert all((a.grad is None) == (b.grad is None) for a, b in zip(ours, theirs))
    assert momentum == 0 or sgd.momentum_buffers[0] is not None


def test_the_local_sgd_refuses_what_torch_optim_sgd_refuses():
    from clients.sgd import FusedSgd

    params = [nn.Parameter(torch.ones(2))]
    with pytest.raises(ValueError, match="Nesterov"):
        FusedSgd(params, torch.zeros(()), momentum=0.0, nesterov=True)
    with pytest.raises(ValueError, match="momentum"):
        FusedSgd(params, torch.zeros(()), momentum=-0.1)


def test_a_client_process_trains_without_importing_torch_dynamo():
    """torch.optim's step and zero_grad import torch._dynamo (seconds per client process)."""
    import subprocess
    import sys

    code = ("import sys, torch\n"
            "from clients.models import build_model\n"
            "from clients.training import LocalTrainingConfig, train_local\n"
            "model = build_model('mlp', (1, 8, 8), 10)\n"
            "x, y = torch.randn(20, 1, 8, 8), torch.randint(0, 10, (20,))\n"
            "train_local(model, x, y, LocalTrainingConfig(lr=0.1, local_epochs=1, batch_size=8, momentum=0.9), "
            "torch.Generator().manual_seed(0))\n"
            "print('torch._dynamo' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
