"""The one local training loop, and evaluation, on device-resident tensors.

Data sets are small, so a client's partition lives on the training device and batches
are index slices of it: no DataLoader, no per-step host→device copies, and the loss is
accumulated on the device and read once per round (no per-step synchronisation).

Local SGD (clients/sgd.py: ``torch.optim.SGD``'s fused kernel, reading η_k from a device
tensor; one step is clients/client_step.py's, replayed as a CUDA graph where it can be):
for each epoch, a seeded permutation of the
partition is cut into batches (or, with ``local_steps`` > 0, exactly that many batches,
epoch after epoch); per batch the *local objective* fills g (default: ∇ CE(w; batch);
MOON, FedSAM, FedAlign, … in clients/objectives/), gradient hooks add their terms, g is
clipped to ``grad_clip`` in global 2-norm when > 0, then the SGD update with momentum
(heavy-ball, or Nesterov's with ``nesterov``, as FedAlign's code) and weight decay. The
momentum buffer starts at zero every round.

Step k of K uses η_k = η·(s·(1 − k/K) + e·k/K), s = ``step_lr_start``, e = ``step_lr_end``:
constant by default (s = e = 1); FedSWA's in-round decay from η to ρ·η (METHODS.md §1.4).

Gradient hooks are called after each backward pass and before clipping: FedProx (Li et
al. 2020, eq. 2) adds μ(w − w^t), the gradient of (μ/2)‖w − w^t‖²; SCAFFOLD and FedMoSWA
add a control-variate correction (clients/control_variates.py), FedDyn its linear and
quadratic terms (clients/feddyn.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from clients.augmentation import CropFlip
from clients.client_info import ClientInfo
from clients.client_step import GradientTerm, client_step, per_step_on
from partitions.text import IGNORE_INDEX


@dataclass(frozen=True)
class LocalTrainingConfig:
    """The hyperparameters a client receives with a round's training message."""

    lr: float
    local_epochs: int
    batch_size: int
    momentum: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float = 0.0
    local_steps: int = 0
    step_lr_start: float = 1.0
    step_lr_end: float = 1.0
    nesterov: bool = False
    # Partial work (straggler-policy = partial, clients/system_speed.py): stop after this many
    # of the K planned steps, on the planned steps' lrs (0: all K).
    step_budget: int = 0

    def planned_steps(self, num_examples: int) -> int:
        """K: ``local_steps`` when set, else ``local_epochs`` passes of ⌈n/B⌉ batches."""
        if self.local_steps > 0:
            return self.local_steps
        return self.local_epochs * -(-num_examples // self.batch_size)

    def num_steps(self, num_examples: int) -> int:
        """The steps the client runs: K, or its step budget where that is fewer."""
        planned = self.planned_steps(num_examples)
        return min(planned, self.step_budget) if self.step_budget > 0 else planned


def in_round_lrs(lr: float, num_steps: int, start_factor: float, end_factor: float) -> list[float]:
    """η_k = η·(s·(1 − k/K) + e·k/K) for k = 0 … K−1 (FedSWA, METHODS.md §1.4)."""
    return [lr * (start_factor * (1 - k / num_steps) + end_factor * k / num_steps) for k in range(num_steps)]


@dataclass(frozen=True)
class LocalTrainingResult:
    mean_loss: float
    num_steps: int
    num_examples: int
    lr_sum: float  # Σ_k η_k: the denominator of option-II control-variate updates


def momentum_a_norm(num_steps: int, momentum: float) -> float:
    """‖a‖₁ = Σ_{k=1}^{K} (1 − ρ^k)/(1 − ρ) for K steps of heavy-ball SGD (ρ = 0: K)."""
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    # Step k's update is η·g·(1 + ρ + … + ρ^{k−1}) when the gradient g is constant.
    return sum((1.0 - momentum**k) / (1.0 - momentum) for k in range(1, num_steps + 1))


def batches(num_examples: int, batch_size: int, num_steps: int, generator: torch.Generator, device) -> Iterator[torch.Tensor]:
    """Index batches of seeded permutations, one epoch after another, ``num_steps`` in all."""
    steps = 0
    while True:
        # The permutation is drawn on the CPU generator so it is identical on any device.
        order = torch.randperm(num_examples, generator=generator).to(device)
        for start in range(0, num_examples, batch_size):
            if steps == num_steps:
                return
            yield order[start : start + batch_size]
            steps += 1


def train_local(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: LocalTrainingConfig,
    generator: torch.Generator,
    gradient_hooks: Sequence[Callable[[list[nn.Parameter]], None]] = (),
    objective: LocalObjective | None = None,
    augment: CropFlip | None = None,
    post_clip_hooks: Sequence[Callable[[list[nn.Parameter]], None]] = (),
    graphs: bool = True,
    mode: str | None = None,
) -> LocalTrainingResult:
    """Run local SGD on (x, y), which live on the model's device; return loss and steps.

    ``objective`` computes each batch's loss and gradient (default: cross-entropy); each
    of ``gradient_hooks`` is then called with the parameters. ``augment``
    (clients/augmentation.py's crop and flip) transforms each batch of images inside the
    step; its draws come from a generator of its own, seeded by one draw from
    ``generator`` before the first batch.
    ``post_clip_hooks`` run after gradient clipping (FedMoSWA's official code adds its
    control-variate correction there). Each step is clients/client_step.py's: on CUDA
    replayed as a CUDA graph where the step allows it and ``graphs`` (run-config
    ``cuda-graphs``), else eager; ``mode`` forces ``eager``, ``static`` or ``graph``.
    """
    objective = objective or CrossEntropy()
    model.train()
    num_steps = config.num_steps(len(y))
    # A client cut short keeps the lrs it planned (FedSWA's in-round decay is not squeezed).
    lrs = in_round_lrs(config.lr, config.planned_steps(len(y)), config.step_lr_start, config.step_lr_end)[:num_steps]
    sizes = batch_sizes(len(y), config.batch_size, num_steps)
    draws = [()] * num_steps
    if augment is not None:
        augment_generator = torch.Generator().manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
        draws = augment.draws(sizes, augment_generator)
    # Every random draw of the round is made here, in step order, and moved to the device at once:
    # a step then reads its draws like its batch, and a captured step replays them (clients/client_step.py).
    draws = per_step_on(x.device, [(*a, *o) for a, o in zip(draws, objective.draws(sizes))])
    full_batch = slice(0, min(config.batch_size, len(y)))
    step = client_step(model, config, objective, gradient_hooks, post_clip_hooks,
                       (x[full_batch], y[full_batch], *draws[0]), graphs, augment, mode)
    steps_per_epoch = -(-len(y) // config.batch_size)
    for k, batch in enumerate(batches(len(y), config.batch_size, num_steps, generator, x.device)):
        step.run(x[batch], y[batch], lrs[k], draws[k])
        if (k + 1) % steps_per_epoch == 0 or k + 1 == num_steps:
            objective.end_epoch()
    return LocalTrainingResult(float(step.loss_sum) / max(num_steps, 1), num_steps, len(y), sum(lrs))


def batch_sizes(num_examples: int, batch_size: int, num_steps: int) -> list[int]:
    """The size of each of :func:`batches`' ``num_steps`` batches (an epoch's last one may be short)."""
    steps_per_epoch = -(-num_examples // batch_size)
    last = num_examples - (steps_per_epoch - 1) * batch_size
    return [last if k % steps_per_epoch == steps_per_epoch - 1 else batch_size for k in range(num_steps)]


class LocalObjective:
    """The local objective of plain FedAvg training: cross-entropy on the batch.

    Subclasses (clients/objectives/) override :meth:`backward`, which must leave the
    batch gradient in ``.grad`` (zeroed before the call) and return the detached loss, and
    :meth:`finish`, called once after the round (to keep client state, undo model changes);
    :meth:`see_client` receives what the client knows of itself before the first step;
    :meth:`after_step` runs after each optimizer step, inside the step (FedFA's
    calibration), :meth:`end_epoch` after each epoch, and :meth:`reply_tensors` names what
    the reply carries besides the model.

    What a step may be captured as a CUDA graph (clients/client_step.py) asks of an objective:

    - ``capturable``: :meth:`backward` and :meth:`after_step` have static shapes, no host
      synchronisation and no Python branching on tensor values. A class is not unless it
      says so itself (a subclass of a capturable objective changes its step, so it does not
      inherit the claim); ``not_captured_because`` then says why (the step's log and the
      benchmark show it). :class:`CrossEntropy`, the default objective, says so.
    - :meth:`signature`: every Python value the step bakes in (hyperparameters, switches);
      a step is reused only by an objective of the same type and signature.
    - ``round_state`` / :meth:`adopt`: the tensors (or modules, or lists of tensors) that
      the step reads or writes and whose values change each round. A reused step keeps the
      first round's objects; a later round's objective copies its values into them and
      takes them over, so the captured step sees them and :meth:`end_epoch`,
      :meth:`finish` and :meth:`reply_tensors` see what the step wrote.
    - :meth:`draws`: randomness per step is drawn for the whole round before its first
      step, in step order, and passed to :meth:`backward` as extra tensors (``*draws``),
      which a captured step copies into static inputs like the batch.
    """

    capturable = False
    not_captured_because = "it does not declare itself capturable"
    round_state: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.capturable = cls.__dict__.get("capturable", False)  # its own claim, never its base's

    def backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *draws: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach()

    def signature(self) -> tuple:
        """The Python values :meth:`backward` and :meth:`after_step` bake into a captured step."""
        return ()

    def see_client(self, client: ClientInfo) -> None:
        """Called once before the round's first step with what the client knows of itself
        (clients/client_info.py: its label counts, size, partition, round, its method's
        keys). A value a captured step reads must be a tensor of ``round_state`` (so a reused
        step sees this client's values, not the first one's), never a Python number baked
        into :meth:`signature`."""

    def draws(self, batch_sizes: Sequence[int]) -> list[tuple[torch.Tensor, ...]]:
        """Per step (of the given batch sizes), the random tensors :meth:`backward` takes (CPU tensors)."""
        return [()] * len(batch_sizes)

    def adopt(self, previous: LocalObjective) -> None:
        """Take over ``previous``'s ``round_state`` (same type and signature: a captured step
        reads and writes those objects), with this round's values copied into them."""
        for name in self.round_state:
            theirs = getattr(previous, name)
            copy_values(theirs, getattr(self, name))
            setattr(self, name, theirs)

    def after_step(self, model: nn.Module) -> None:
        """Called after each optimizer step (FedFA calibrates its classifier here)."""

    def end_epoch(self) -> None:
        """Called after each pass over the local data (FedFA updates its anchors here)."""

    def finish(self, model: nn.Module) -> None:
        """Nothing to keep after a round of plain cross-entropy."""

    def reply_tensors(self) -> dict[str, torch.Tensor]:
        """Tensors the client sends back besides its model (one ArrayRecord named after the objective)."""
        return {}


class CrossEntropy(LocalObjective):
    """Cross-entropy on the batch: plain FedAvg training, the objective when a method names none."""

    capturable = True  # one forward and backward of static shapes


@torch.no_grad()
def copy_values(target, source) -> None:
    """Copy ``source``'s values into ``target``: tensors, lists or tuples of them, modules
    (parameters and buffers), optimizers of the same parameters (a state ``source`` has
    not created yet is zeroed: a fresh Adam's), or None on both sides."""
    if isinstance(target, torch.Tensor):
        target.copy_(source)
    elif isinstance(target, nn.Module):
        for mine, value in zip([*target.parameters(), *target.buffers()], [*source.parameters(), *source.buffers()]):
            mine.copy_(value)
    elif isinstance(target, torch.optim.Optimizer):
        for param, state in target.state.items():
            for name, tensor in state.items():
                if not isinstance(tensor, torch.Tensor):
                    continue
                if param in source.state:
                    tensor.copy_(source.state[param][name])
                else:
                    tensor.zero_()
    elif isinstance(target, (list, tuple)):
        for mine, value in zip(target, source, strict=True):
            copy_values(mine, value)
    elif target is not None or source is not None:
        raise TypeError(f"cannot copy {type(source).__name__} into {type(target).__name__}")


def proximal_hook(model: nn.Module, mu: float) -> GradientTerm:
    """FedProx's hook, anchored at the model's current (global) weights."""
    anchors = [p.detach().clone() for p in model.parameters()]
    return GradientTerm(f"fedprox mu={mu!r}", lambda params, inputs: add_proximal_gradient(params, inputs, mu), anchors)


@torch.no_grad()
def add_proximal_gradient(params, anchors: list[torch.Tensor], mu: float) -> None:
    """g ← g + μ(w − w^t): the gradient of FedProx's (μ/2)‖w − w^t‖²."""
    for param, anchor in zip(params, anchors):
        param.grad.add_(param - anchor, alpha=mu)


# Evaluation batches: on the CPU small enough that a batch's activations stay in the caches
# (the FMNIST CNN's 10,000 test images on 2 threads, channels-last: 0.44 s in batches of 256,
# 0.90 s in batches of 2,048; 2026-12-06), on a GPU large enough to fill it.
EVALUATION_BATCH = {"cpu": 256, "cuda": 2048}


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int | None = None) -> tuple[float, float]:
    """Mean cross-entropy and top-1 accuracy of ``model`` on (x, y), over the scored
    targets: every label of a classification set; every position but padding
    (IGNORE_INDEX) of a next-character set, whose outputs are (N, classes, positions);
    in batches of ``batch_size`` (default: the device's ``EVALUATION_BATCH``)."""
    batch_size = batch_size or EVALUATION_BATCH.get(x.device.type, 2048)
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=x.device)
    correct = torch.zeros((), dtype=torch.int64, device=x.device)
    scored = torch.zeros((), dtype=torch.int64, device=x.device)
    for start in range(0, len(y), batch_size):
        logits = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        valid = target != IGNORE_INDEX
        loss_sum += F.cross_entropy(logits, target, reduction="sum", ignore_index=IGNORE_INDEX).double()
        correct += ((logits.argmax(dim=1) == target) & valid).sum()
        scored += valid.sum()
    count = max(int(scored), 1)
    return float(loss_sum) / count, float(correct) / count


def select_device(preference: str) -> torch.device:
    """'auto' → CUDA when available, else CPU; 'cuda' fails clearly without a GPU."""
    if preference == "cuda" and not torch.cuda.is_available():
        raise ValueError("device = 'cuda' but no CUDA device is available; allowed here: 'cpu' or 'auto'")
    if preference == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")
