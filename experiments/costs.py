"""Cost of one client's local training, per method: FLOPs, parameters held, memory, time.

    python -m experiments.costs                     # ResNet-56, CIFAR-100 shape, default methods
    python -m experiments.costs --model resnet56 --methods fedavg,fedprox,moon,gradaug-n1,gradaug-n2,fedalign \\
        --input-shape 3,32,32 --num-classes 100 --batch-size 64 --steps 10 --device auto --out costs.csv

FedAlign's claim (Mendieta et al., CVPR 2022) is about cost: one model in memory and ~2% extra FLOPs
on ResNet-56, against MOON's three models and GradAug's n extra sub-network passes. This
command measures those costs on Basin's own client path, not on a re-implementation:
for each method the run config is resolved and validated (``resolve_config``), the
strategy is built (``build_strategy``) and its ``configure_train`` produces the real
training Message for a one-client cohort (round 1, the ServerApp's
``round_train_config``); the client side then loads the sent model and builds
``LocalRound(model, message.content, RecordDict(), rng)`` exactly as the ClientApp does,
and every measured step is ``LocalRound.train`` on synthetic data (random inputs of
``--input-shape`` and random labels; costs do not depend on the values, no data set is
loaded). The number of measured steps is set through the round config's own
``local-steps`` key. ``--set KEY=VALUE`` overrides run-config keys for every method (e.g.
``prox-mu``, ``fedalign-width``, ``gradaug-min-width``). Method names: any
strategy, plus the methods' cost-table entries (``gradaug-n1``, ``gradaug-n2``: GradAug with
``gradaug-subnets = 1, 2``; other values: ``--set gradaug-subnets=k``), each
optionally with ``+crop-flip`` (``augment = crop-flip``: what the on-device random crop
and flip of clients/augmentation.py add to a step).
FedAvg is always measured, first, as the reference of the ratio columns.

Columns (one row per method):

- ``fwd GFLOPs/sample``: forward FLOPs per training sample of one local step.
  ``torch.utils.flop_counter.FlopCounterMode`` sees every aten op of the step — the
  forward passes, the backward passes and the optimizer update — and counts the ops it
  has formulas for (matrix products and convolutions, 2 FLOPs per multiply-add;
  elementwise ops, normalisations and the SGD update count 0). An op is a *forward* op
  when it runs outside the autograd engine (``torch._C._current_graph_task_id() == -1``)
  and a *backward* op when the engine runs it while executing ``.backward()``. So every
  forward computation of the objective is counted, also those under ``no_grad`` (MOON's
  global and previous models) and SAM's second forward at the perturbed weights, and
  no backward op is, whatever the method does between them. Counted over ``--steps``
  steps and divided by steps × batch size (GradAug draws its sub-network widths and
  resolutions at random, so it is the average over those steps). FedAlign's batched
  matrix products (transmitting matrices, their Gram matrices T·Tᵀ and the power
  iterations) are counted too, besides its slim last-stage pass; on ResNet-56 at 32×32
  the slim pass alone is ~2% of FedAvg's forward FLOPs (the paper's figure) and the
  products about 7.6% more. Stochastic Depth computes dropped branches and multiplies
  them by zero (``torchvision.ops.stochastic_depth``), so it counts as FedAvg.
- ``train GFLOPs/sample``: all counted FLOPs of a step (forward + backward) per sample.
- ``fwd ×`` / ``train ×``: the same relative to the FedAvg row.
- ``params held (M)`` / ``params ×``: tensor elements held in memory during local training
  by the model plus the round's method state, in millions and as a multiple of the
  model's parameter count. The model's parameters (and buffers) are counted, then the
  attributes of the ``LocalRound`` — its objective, gradient hooks (closures included:
  FedProx's anchor), control-variate and FedDyn objects — are walked recursively through
  tensors, lists, tuples, dicts and ``nn.Module`` parameters/buffers; each tensor storage
  is counted once. This is what the implementation holds in a client's first round (e.g.
  FedProx keeps w^t: 2×; SCAFFOLD keeps c, c_i, c − c_i and w^t: 5×; FedCM the server's
  direction D: 2×; FedACG the look-ahead θ̃ its proximal term anchors to: 2×; MIME θ, m and c
  (the extra full-batch pass of its exchange is not in the per-step columns); MOON two frozen
  model copies: 3×; FedAlign and GradAug only the model: 1×). Not counted, because every
  method has them or they live only inside a step: gradients, the SGD momentum buffer,
  activations, SAM's ε (all part of the peak memory), and the host copies of
  ``context.state`` that later rounds keep (MOON's previous model, SCAFFOLD's c_i).
- ``peak MiB``: ``torch.cuda.max_memory_allocated`` after resetting the peak statistics
  just before the model is moved to the device, read after the timed steps: the model,
  the method's copies, gradients, optimizer state and activations of local training.
  On the CPU this is not measured and the column says ``n/a``.
- ``s/step``: wall seconds per local step: after one warm-up step, ``--steps`` steps are
  timed one by one (each a one-step ``LocalRound.train``, CUDA synchronised before and
  after) and the median is reported, so a burst of other work on a shared machine does
  not decide the number; ``time ×`` is relative to FedAvg, measured in the same process.
  ``--round-steps K`` adds ``s/round`` = s/step × K.
"""

from __future__ import annotations

import argparse

from experiments.runtime.cli import exit_command, guarded, nonempty_path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.costs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="resnet56",
                        help="a model name (default resnet56; `python -m experiments.run --list-keys` lists them)")
    parser.add_argument("--methods", default=None,
                        help="comma-separated strategy names or cost-table entries such as gradaug-n2 (default: each method's cost-table "
                             "entries, FedAvg, FedProx, SCAFFOLD, FedCM, … FedAlign)")
    parser.add_argument("--input-shape", default="3,32,32", help="C,H,W of one sample (default 3,32,32: CIFAR)")
    parser.add_argument("--num-classes", type=int, default=100, help="classifier outputs (default 100: CIFAR-100)")
    parser.add_argument("--batch-size", type=int, default=64, help="local batch size (default 64)")
    parser.add_argument("--steps", type=int, default=10, help="measured local steps per method (default 10)")
    parser.add_argument("--round-steps", type=int, default=0,
                        help="local steps of one round; > 0 adds an s/round column (default 0: omitted)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    parser.add_argument("--threads", type=int, default=0,
                        help="CPU threads of torch (default 0: torch's default); 1 gives steadier CPU timings "
                             "on a busy machine")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a run-config key for every method (e.g. prox-mu=0.01)")
    parser.add_argument("--out", type=nonempty_path, help="also write the table as CSV to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The implementation imports torch and Flower: only once the arguments parsed.
    from experiments.runtime.method_costs import run_command

    return guarded(lambda: run_command(args))


if __name__ == "__main__":
    exit_command(main())
