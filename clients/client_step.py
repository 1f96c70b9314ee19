"""One local SGD step, run eagerly, from static buffers, or replayed as a CUDA graph.

A step is: the augmentation of the batch (crop and flip, when the run has it), the local
objective's loss and gradient on it, the gradient terms (FedProx, SCAFFOLD, FedDyn, …),
clipping to ``grad_clip`` in global 2-norm when > 0, the post-clip terms, then SGD
(momentum, Nesterov, weight decay: clients/sgd.py, ``torch.optim.SGD``'s fused kernel, which
reads each step's learning rate from a one-element device tensor, so a captured step sees
each step's η_k), the objective's ``after_step`` (FedFA's calibration), and the loss added
to a device-resident sum. A step's inputs are its batch and its random draws (crop offsets
and flips, Mixup's λ and pairing, Stochastic Depth's drops), all drawn before the round.

Modes (:func:`step_mode`): ``eager`` (every batch as it comes); ``static`` (full batches
and draws copied into fixed buffers, per-round inputs refreshed in place, the first round's
objective adopting later rounds' state; on the CPU bitwise the eager step); ``graph``
(``static`` on CUDA, captured once per process, model and step signature after
:data:`WARMUP_STEPS` real steps, then replayed: one launch instead of hundreds per step).
A graph that cannot be used falls back to eager steps for its step signature, said once,
recorded (:func:`graph_fallbacks`) and without failing the run
(:meth:`ClientStep._capture_checked`); other models and methods of the process still capture. The last, short batch of an epoch is trained
eagerly with the same state: every sample is used, nothing recaptured.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from clients.log import log
from clients.sgd import FusedSgd

# Real steps run before capture: lets cuDNN pick its kernels and the optimizer create its
# momentum buffers outside the graph.
WARMUP_STEPS = 3
# How far the first replay may be from the eager step before the graph is distrusted:
# the same kernels, so only reduction order (atomics) may differ.
REPLAY_RTOL, REPLAY_ATOL = 1e-3, 1e-5


@dataclass
class GradientTerm:
    """A gradient hook whose per-round inputs are tensors: ``apply(params, inputs)`` adds
    its term to each ``param.grad``. ``name`` holds its constants (e.g. FedProx's μ): a
    captured step is reused only for terms of the same names, reading static copies of
    ``inputs`` that are refreshed every round."""

    name: str
    apply: Callable[[list[nn.Parameter], list[torch.Tensor]], None]
    inputs: list[torch.Tensor]

    def __call__(self, params: list[nn.Parameter]) -> None:
        self.apply(params, self.inputs)


def step_mode(device: torch.device, graphs: bool, objective, terms: Sequence) -> tuple[str, str]:
    """(mode, why): ``graph`` on CUDA when asked for and every part of the step has static
    shapes and no host work per step (augmentation runs inside any step); else ``eager``,
    and why not graph.

    In ``static`` and ``graph`` modes the gradient terms read static copies of their
    per-round inputs, refreshed in place every round, and the objective is the first
    round's, whose round state later rounds' objectives write into and share
    (``LocalObjective.adopt``); the step object lives as long as the process and its model.
    A graph is captured after :data:`WARMUP_STEPS` real steps on a side stream (PyTorch's
    CUDA-graph notes); when capture raises, or the first replay's parameters and loss differ
    from the same step run eagerly beyond :data:`REPLAY_RTOL`/:data:`REPLAY_ATOL` (not
    checked for a model with dropout), that step signature trains eagerly from then on."""
    if device.type != "cuda":
        return "eager", "not on CUDA"
    if not graphs:
        return "eager", "cuda-graphs = false"
    if not objective.capturable:
        return "eager", f"the {type(objective).__name__} objective is not captured: {objective.not_captured_because}"
    plain = [getattr(term, "__qualname__", repr(term)) for term in terms if not isinstance(term, GradientTerm)]
    if plain:
        return "eager", f"gradient hooks {plain} have no static inputs"
    return "graph", ""


class ClientStep:
    """The local SGD step of one model with one configuration (see the module docstring)."""

    def __init__(self, model: nn.Module, config, objective, terms: Sequence, post_clip_terms: Sequence,
                 mode: str, example: Sequence[torch.Tensor] = (), augment=None, key: tuple = ()):
        self.model = model
        self.key = key  # the step signature (:func:`client_step`): what a fall-back is kept to
        self.params = list(model.parameters())
        self.device = self.params[0].device
        self.config = config
        self.objective = objective
        self.augment = augment
        self.mode = mode
        self.lr = torch.zeros((), device=self.device)
        self.loss_sum = torch.zeros((), device=self.device)
        self.optimizer = FusedSgd(self.params, self.lr, momentum=config.momentum, weight_decay=config.weight_decay,
                                  nesterov=config.nesterov)
        static = mode != "eager"
        self.terms = [_bound(t, static) for t in terms]
        self.post_clip_terms = [_bound(t, static) for t in post_clip_terms]
        # The step's inputs (x, y, draws …) as fixed buffers: a full batch is copied into them.
        self.static_inputs = [torch.empty_like(t) for t in example] if static else []
        self.graph: torch.cuda.CUDAGraph | None = None
        self.side_stream = side_stream(self.device) if mode == "graph" else None
        self.eager_steps = 0

    def start_round(self, objective, terms: Sequence, post_clip_terms: Sequence) -> None:
        """Reuse this step for a new round: the new objective takes over the step's round
        state with its values, the terms' new inputs are copied into the static ones,
        momentum and the loss sum start from zero."""
        if objective is not self.objective:
            objective.adopt(self.objective)
        with torch.no_grad():
            for (_, static), term in zip(self.terms + self.post_clip_terms, [*terms, *post_clip_terms]):
                for buffer, value in zip(static, term.inputs):
                    buffer.copy_(value)
            for buffer in self.optimizer.momentum_buffers:
                if buffer is not None:
                    buffer.zero_()  # μ·0 + g = g: as a fresh optimizer's first step
            self.loss_sum.zero_()

    def run(self, x: torch.Tensor, y: torch.Tensor, lr: float, draws: Sequence[torch.Tensor] = ()) -> None:
        """One step on the batch (x, y) and its draws with learning rate ``lr``."""
        self.lr.fill_(lr)
        inputs = (x, y, *draws)
        if not self.static_inputs or len(y) != len(self.static_inputs[1]):
            self._eager(inputs)
            return
        for buffer, value in zip(self.static_inputs, inputs, strict=True):
            buffer.copy_(value)
        if self.graph is not None:
            self.graph.replay()
        elif self.mode == "graph" and self.eager_steps >= WARMUP_STEPS:
            self._capture_checked()
        else:
            self._eager(self.static_inputs)

    def _capture_checked(self) -> None:
        """This step as a captured graph's first replay, checked against the same step run
        eagerly; on a capture that raises or a replay that differs, the eager result is
        kept and this step signature trains eagerly from then on (:meth:`_use_eager`)."""
        before = self._snapshot()
        self._eager(self.static_inputs)
        eager = self._snapshot()
        self._restore(before)
        try:
            self._capture()
            self.graph.replay()
        except Exception as error:  # any failure of capture or replay: eager steps still work
            self._use_eager(eager, f"capture failed ({type(error).__name__}: {str(error).splitlines()[0][:200]})")
            return
        if not _has_dropout(self.model):
            replayed = self._snapshot()
            far = [i for i, (a, b) in enumerate(zip(replayed, eager))
                   if not torch.allclose(a, b, rtol=REPLAY_RTOL, atol=REPLAY_ATOL, equal_nan=True)]
            if far:
                self._use_eager(eager, f"the first replay differs from the eager step (in {len(far)} of "
                                       f"{len(eager)} tensors, beyond rtol {REPLAY_RTOL:g}, atol {REPLAY_ATOL:g})")

    def _snapshot(self) -> list[torch.Tensor]:
        """Copies of what a step changes: parameters, buffers, momentum buffers, the loss
        sum and the objective's round state."""
        synchronize(self.device)
        return [t.detach().clone() for t in self._step_state()]

    def _restore(self, snapshot: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for tensor, saved in zip(self._step_state(), snapshot):
                tensor.copy_(saved)
        synchronize(self.device)

    def _step_state(self) -> list[torch.Tensor]:
        buffers = self.optimizer.momentum_buffers
        return [*self.params, *self.model.buffers(), *(b for b in buffers if b is not None), self.loss_sum,
                *_tensors_of([getattr(self.objective, name) for name in self.objective.round_state])]

    def _use_eager(self, eager: list[torch.Tensor], why: str) -> None:
        """Keep the eager step's result and train this step signature eagerly from now on:
        recorded (:func:`graph_fallbacks`) and said once in the run's log."""
        self.graph = None
        self.mode = "static"  # eager steps from the static buffers: no side stream, nothing captured
        self._restore(eager)
        if self.key not in _GRAPH_FALLBACKS:
            log.warning(f"client step: CUDA graphs off for this step ({type(self.objective).__name__} objective, "
                        f"{type(self.model).__name__} model), eager steps from now on: {why}")
        _GRAPH_FALLBACKS[self.key] = why

    def _eager(self, inputs: Sequence[torch.Tensor]) -> None:
        if self.mode != "graph":
            self.optimizer.zero_grad(set_to_none=True)
            self._body(inputs)
        else:  # warm-up and short batches: on a side stream, as CUDA-graph capture asks
            with on_side_stream(self.side_stream, self.device):
                # After capture the gradients are the graph's own tensors: zeroed, not replaced.
                self.optimizer.zero_grad(set_to_none=self.graph is None)
                self._body(inputs)
        self.eager_steps += 1

    def _body(self, inputs: Sequence[torch.Tensor]) -> None:
        x, y, *draws = inputs
        if self.augment is not None:
            x = self.augment(x, *draws[:AUGMENT_DRAWS])
            draws = draws[AUGMENT_DRAWS:]
        loss = self.objective.backward(self.model, x, y, *draws)
        for apply, term_inputs in self.terms:
            apply(self.params, term_inputs)
        if self.config.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.params, self.config.grad_clip)
        for apply, term_inputs in self.post_clip_terms:
            apply(self.params, term_inputs)
        self.optimizer.step()
        self.objective.after_step(self.model)
        self.loss_sum += loss

    def _capture(self) -> None:
        torch.cuda.synchronize(self.device)
        self.optimizer.zero_grad(set_to_none=True)  # the graph's backward allocates its own gradients
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._body(self.static_inputs)
        self.graph = graph


# The augmentation's draws per step: the crop's row and column offsets and the flip bits.
AUGMENT_DRAWS = 3


def per_step_on(device: torch.device, per_step: Sequence[tuple[torch.Tensor, ...]]) -> list[tuple[torch.Tensor, ...]]:
    """The round's per-step draws (CPU tensors) on ``device``, moved in one copy per kind
    (a step's k-th tensors of all steps together), each step's a view of those copies."""
    if not per_step or not per_step[0]:
        return list(per_step)
    moved = []
    for kind in zip(*per_step, strict=True):
        flat = torch.cat([t.reshape(-1) for t in kind]).to(device)
        moved.append([piece.view(t.shape) for piece, t in zip(flat.split([t.numel() for t in kind]), kind)])
    return list(zip(*moved))


def _tensors_of(values) -> list[torch.Tensor]:
    """The tensors in a list of tensors, modules (parameters and buffers), optimizers
    (their state), lists of those, or None."""
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, nn.Module):
            found += [*value.parameters(), *value.buffers()]
        elif isinstance(value, torch.optim.Optimizer):
            found += [t for state in value.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
        elif isinstance(value, (list, tuple)):
            found += _tensors_of(value)
    return found


def side_stream(device: torch.device) -> torch.cuda.Stream | None:
    """A stream for a graph step's eager work (None off CUDA, where there are no streams)."""
    return torch.cuda.Stream(device) if device.type == "cuda" else None


@contextmanager
def on_side_stream(stream: torch.cuda.Stream | None, device: torch.device) -> Iterator[None]:
    """Run the block on ``stream`` after the current stream's work, and make the current
    stream wait for it (nothing to do without a stream)."""
    if stream is None:
        yield
        return
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream(device).wait_stream(stream)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _has_dropout(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())


# Why each step signature of this process stopped using CUDA graphs: {step key: why}. A
# failure is kept to the signature that failed: other models and methods still capture.
_GRAPH_FALLBACKS: dict[tuple, str] = {}


def graph_fallbacks() -> list[str]:
    """Why steps of this process fell back from CUDA graphs to eager steps (empty: none did)."""
    return list(_GRAPH_FALLBACKS.values())


def _bound(term, static: bool) -> tuple[Callable, list[torch.Tensor]]:
    """(apply, inputs) of a hook; a static step reads its own copies of a term's inputs."""
    if not isinstance(term, GradientTerm):
        return (lambda params, _inputs: term(params)), []
    return term.apply, [value.detach().clone() for value in term.inputs] if static else term.inputs


# Steps kept for the life of a client process: {key: ClientStep}. A key holds the model
# object (the process reuses one per architecture) and everything the captured step bakes in.
_PROCESS_STEPS: dict[tuple, ClientStep] = {}
_EAGER_NOTED: set[str] = set()


def client_step(model: nn.Module, config, objective, terms: Sequence, post_clip_terms: Sequence,
                example: Sequence[torch.Tensor], graphs: bool, augment=None, mode: str | None = None) -> ClientStep:
    """The step for this round: a new eager one, or the process's static/graph step for
    this model and signature (``mode`` forces one, for tests and benchmarks). ``example``:
    a full batch's inputs, (x, y, draws …)."""
    device = next(model.parameters()).device
    chosen, why = step_mode(device, graphs, objective, [*terms, *post_clip_terms])
    mode = mode or chosen
    if mode == "eager":
        if device.type == "cuda" and why not in _EAGER_NOTED:
            _EAGER_NOTED.add(why)
            log.info(f"client step: eager, not a CUDA graph: {why}")
        return ClientStep(model, config, objective, terms, post_clip_terms, "eager", augment=augment)
    if not all(isinstance(t, GradientTerm) for t in [*terms, *post_clip_terms]):
        raise ValueError(f"a {mode} step needs every gradient hook as a GradientTerm (static inputs)")
    key = (id(model), mode, type(objective), objective.signature(), None if augment is None else augment.signature(),
           tuple((tuple(t.shape), t.dtype) for t in example),
           config.momentum, config.weight_decay, config.nesterov, config.grad_clip,
           tuple(t.name for t in terms), tuple(t.name for t in post_clip_terms))
    step = _PROCESS_STEPS.get(key)
    if step is None or step.model is not model:
        if mode == "graph" and key in _GRAPH_FALLBACKS:
            mode = "static"  # this signature's graph failed in this process: not captured again
        step = _PROCESS_STEPS[key] = ClientStep(model, config, objective, terms, post_clip_terms, mode, example, augment,
                                                key)
    step.start_round(objective, terms, post_clip_terms)
    return step
