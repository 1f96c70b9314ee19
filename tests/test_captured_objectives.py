"""Every captured local objective, with and without crop + flip: the static step — what a
CUDA graph replays: the first round's objective and round state, fixed input buffers,
each step's draws copied in — is bitwise the eager step on the CPU, over rounds whose
inputs change (new anchors, global models, corrections, client state)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from clients.augmentation import CropFlip
from clients.mime import MimeObjective
from clients.models import build_model
from clients.objectives.fedalign import FedAlign
from clients.objectives.fedfa import FeatureAnchors
from clients.objectives.fedlesam import LocallyEstimatedSam
from clients.objectives.label_smoothing import LabelSmoothing
from clients.objectives.mixup import Mixup
from clients.objectives.moon import Moon
from clients.objectives.sam import SharpnessAware
from clients.objectives.stochastic_depth import StochasticDepth
from clients.training import CrossEntropy, LocalTrainingConfig, train_local
from strategies.methods import MethodSpec
from strategies.methods.registry import METHODS_BY_NAME

ROUNDS = 3
SHAPE = (1, 8, 8)


def _round_values(model, server_round: int, like) -> dict[str, torch.Tensor]:
    """Inputs that differ every round, by parameter name."""
    generator = torch.Generator().manual_seed(50 + server_round)
    return {name: torch.randn(p.shape, generator=generator) * 0.01 * (server_round + 1) for name, p in like}


def _anchors(model, server_round: int) -> torch.Tensor:
    features = model.classifier.in_features
    return torch.randn(10, features, generator=torch.Generator().manual_seed(server_round))


def _h(server_round: int) -> float:
    """A hyperparameter's factor: the same in the first two rounds (the step is reused), another in the last
    (a step of its own: the objective's signature changed)."""
    return 1.0 if server_round < ROUNDS - 1 else 2.0


# name -> objective of a round: (model, round, client state, rng) -> LocalObjective
OBJECTIVES = {
    "cross-entropy": lambda model, r, state, rng: CrossEntropy(),
    "label-smoothing": lambda model, r, state, rng: LabelSmoothing(0.1 * _h(r)),
    "fedsam": lambda model, r, state, rng: SharpnessAware(0.05 * _h(r)),
    "fedasam": lambda model, r, state, rng: SharpnessAware(0.7, adaptive=True, eta=0.2 * _h(r)),
    "fedalign": lambda model, r, state, rng: FedAlign(0.45 * _h(r), 0.25),
    "moon": lambda model, r, state, rng: Moon(model, state, 1.0 * _h(r), 0.5),
    "mime": lambda model, r, state, rng: MimeObjective(model, _round_values(model, r, model.named_parameters())),
    "fedlesam": lambda model, r, state, rng: LocallyEstimatedSam(model, state, 0.05),
    "fedfa": lambda model, r, state, rng: FeatureAnchors(model, _anchors(model, r), 1.0, 0.9 * _h(r)),
    # IMA's schedule switches FedFA's parts per round.
    "fedfa-switched": lambda model, r, state, rng: FeatureAnchors(model, _anchors(model, r), 1.0, 0.9,
                                                                  anchor_loss=r != 1, calibrate=r != 2),
    "mixup": lambda model, r, state, rng: Mixup(0.1 * _h(r), rng),
    "stochastic-depth": lambda model, r, state, rng: StochasticDepth(model, 0.5 * _h(r) ** -1),
}
# GradAug's sub-networks change resolution and width at random each step: never captured.
NOT_CAPTURED = {"gradaug"}


def _declared(spec: MethodSpec):
    """A declared objective without a case above (a plug-in's, MoFedSAM's): built each round
    by its declaration's builder, from its keys' defaults."""
    settings = {key: option.default for key, option in spec.options.items()}
    return lambda model, r, state, rng: spec.objective(settings, model, state, rng, {})


# Every declared objective (a plug-in's included), captured, by the name of its method.
DECLARED = {name for name, spec in METHODS_BY_NAME.items() if spec.objective is not None} - NOT_CAPTURED


def _case(name: str):
    """The round's objective of a case: the table's, else the declaration's from its defaults."""
    return OBJECTIVES[name] if name in OBJECTIVES else _declared(METHODS_BY_NAME[name])


def _train(name: str, mode: str, augment: bool, device: str = "cpu") -> list[tuple]:
    """ROUNDS rounds of one client; per round its loss, weights, buffers and reply tensors."""
    from clients import client_step

    client_step._PROCESS_STEPS.clear()
    torch.manual_seed(0)
    model = build_model("resnet20-gn", SHAPE, 10).to(device)
    x, y = torch.randn(22, *SHAPE).to(device), torch.randint(0, 10, (22,)).to(device)  # 2 × 8 + a short batch of 6
    state = RecordDict()
    results = []
    for server_round in range(ROUNDS):
        torch.manual_seed(100 + server_round)  # torch's global generator, as round_randomness seeds it
        rng = np.random.default_rng(server_round)
        objective = _case(name)(model, server_round, state, rng)
        config = LocalTrainingConfig(lr=0.05 * 0.9**server_round, local_epochs=2, batch_size=8, momentum=0.9,
                                     weight_decay=1e-3, grad_clip=5.0)
        result = train_local(model, x, y, config, torch.Generator().manual_seed(server_round), objective=objective,
                             augment=CropFlip([-0.5]) if augment else None, mode=mode)
        objective.finish(model)
        replies = {k: v.clone() for k, v in objective.reply_tensors().items()}
        results.append((result.mean_loss, copy.deepcopy(model.state_dict()), replies))
    return results


@pytest.mark.parametrize("augment", [False, True], ids=["plain", "crop-flip"])
@pytest.mark.parametrize("name", sorted(set(OBJECTIVES) | DECLARED))
def test_the_captured_step_of_each_objective_is_bitwise_its_eager_step(name, augment):
    eager = _train(name, "eager", augment)
    static = _train(name, "static", augment)
    for server_round, ((eager_loss, eager_weights, eager_replies), (static_loss, static_weights, static_replies)) in \
            enumerate(zip(eager, static)):
        assert static_loss == eager_loss, f"round {server_round}: the loss differs"
        for key in eager_weights:
            assert torch.equal(static_weights[key], eager_weights[key]), f"round {server_round}: {key} differs"
        assert eager_replies.keys() == static_replies.keys()
        for key in eager_replies:
            assert torch.equal(static_replies[key], eager_replies[key]), f"round {server_round}: reply {key} differs"
    # The rounds trained: the weights moved every round.
    assert not torch.equal(eager[0][1]["stem.0.weight"], eager[-1][1]["stem.0.weight"])


def test_every_declared_objective_has_a_case_that_builds_and_steps():
    """Each declared objective's case (the table's, or its declaration's from its keys'
    defaults) builds an objective that takes a step: a declared objective whose builder needs
    more than its defaults (records from the message) and has no case in the table fails here."""
    model = build_model("resnet20-gn", SHAPE, 10)
    x, y = torch.randn(8, *SHAPE), torch.randint(0, 10, (8,))
    config = LocalTrainingConfig(lr=0.01, local_epochs=1, batch_size=8, momentum=0.0, weight_decay=0.0, grad_clip=0.0)
    assert {"mime", "fedfa", "mofedsam"} <= DECLARED  # a server method's objective, an objective-only one, a fallback
    for name in sorted(DECLARED):
        try:
            objective = _case(name)(model, 0, RecordDict(), np.random.default_rng(0))
            result = train_local(model, x, y, config, torch.Generator().manual_seed(0), objective=objective, mode="eager")
        except Exception as error:
            raise AssertionError(f"{name}: its case does not build or step ({type(error).__name__}: {error}); add one "
                                 f"to OBJECTIVES") from error
        assert result.num_steps == 1 and np.isfinite(result.mean_loss), name


def test_every_objective_but_gradaug_is_captured():
    """What `experiments.benchmark --methods --modes` reports, at the objective level."""
    from clients.client_step import step_mode
    from clients.objectives.gradaug import GradAug

    model = build_model("resnet20-gn", SHAPE, 10)
    cuda = torch.device("cuda")
    for name, make in OBJECTIVES.items():
        assert step_mode(cuda, True, make(model, 1, RecordDict(), np.random.default_rng(0)), []) == ("graph", ""), name
    mode, why = step_mode(cuda, True, GradAug(2, 0.8, 1.75, np.random.default_rng(0)), [])
    assert mode == "eager" and "resolutions" in why


def test_the_draws_of_a_round_are_the_draws_step_after_step():
    """Drawing a round's crops and Mixup pairings up front leaves each step what it drew before."""
    from clients.augmentation import crop_flip

    x = torch.randn(5, 1, 8, 8)
    up_front = CropFlip([0.0]).draws([5, 5, 3], torch.Generator().manual_seed(3))
    one_by_one = torch.Generator().manual_seed(3)
    for draws, batch in zip(up_front, [x, x, x[:3]]):
        assert torch.equal(CropFlip([0.0])(batch, *draws), crop_flip(batch, one_by_one, torch.zeros(1)))
    lam, rest, pairing = Mixup(0.1, np.random.default_rng(7)).draws([4, 2])[1]
    reference = np.random.default_rng(7)
    reference.beta(0.1, 0.1), reference.permutation(4)
    expected = reference.beta(0.1, 0.1)
    assert (lam.item(), rest.item()) == (np.float32(expected), np.float32(1 - expected))
    assert pairing.tolist() == reference.permutation(2).tolist()


def _graph_run_follows_eager(name: str, augment: bool, device: str, deterministic: bool) -> None:
    """The gpu test's check: no step of the graph run fell back to eager steps (Basin's own
    record, clients/client_step.py's graph_fallbacks, not a log stream), and everything each
    round returns (loss, weights and buffers, the reply's tensors: FedFA's class sums and
    anchors reach the server only there) follows the eager run within float rounding."""
    from clients import client_step
    from clients.arithmetic import fix_arithmetic

    if device == "cuda":  # the kernels a user gets: cuda-deterministic = true is the default
        fix_arithmetic(torch.get_num_threads(), torch.device(device), deterministic)
    client_step._GRAPH_FALLBACKS.clear()
    eager = _train(name, "eager", augment, device)
    graph = _train(name, "graph", augment, device)
    assert not client_step.graph_fallbacks(), f"the graph run fell back to eager steps: {client_step.graph_fallbacks()}"
    for (eager_loss, eager_weights, eager_replies), (graph_loss, graph_weights, graph_replies) in zip(eager, graph):
        assert graph_loss == pytest.approx(eager_loss, rel=1e-3)
        for key in eager_weights:
            torch.testing.assert_close(graph_weights[key], eager_weights[key], rtol=1e-3, atol=1e-4)
        assert graph_replies.keys() == eager_replies.keys()
        for key in eager_replies:
            torch.testing.assert_close(graph_replies[key], eager_replies[key], rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("deterministic", [True, False], ids=["cuda-deterministic", "fastest-kernels"])
@pytest.mark.parametrize("augment", [False, True], ids=["plain", "crop-flip"])
@pytest.mark.parametrize("name", sorted(set(OBJECTIVES) | DECLARED))
def test_each_objective_is_captured_and_replays_its_eager_steps_on_cuda(name, augment, deterministic, monkeypatch):
    from clients import client_step

    monkeypatch.setattr(client_step, "_GRAPH_FALLBACKS", {})
    _graph_run_follows_eager(name, augment, "cuda", deterministic)


def test_the_gpu_check_fails_when_a_step_falls_back_to_eager(monkeypatch):
    """The check above is known to bite before it meets a GPU: on the CPU a forced graph
    step's capture fails (no CUDA) and the step falls back to eager, as a capture that
    raises on a GPU would; its results equal the eager run's, and the check must fail."""
    from clients import client_step

    monkeypatch.setattr(client_step, "_GRAPH_FALLBACKS", {})
    with pytest.raises(AssertionError, match=r"the graph run fell back to eager steps: \['capture failed"):
        _graph_run_follows_eager("label-smoothing", False, "cpu", True)
