"""Measuring what one client's local training costs, per method, and what it exchanges with
the server each round (experiments/measurement/method_traffic.py): the implementation behind
``.venv/bin/python -m experiments.costs``. Its command line (experiments/costs.py) answers
``--help`` and usage errors before this module imports torch and Flower.
"""

from __future__ import annotations

import gc
import statistics
import time
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from clients import protocol
from clients.client_info import ClientInfo
from clients.local_round import LocalRound
from clients.log import log
from clients.models import MODEL_NAMES, build_model, uses_projection_head
from clients.training import select_device
from experiments.measurement.method_traffic import RoundTraffic, measure_traffic, server_side
from experiments.runtime.cli import UsageError
from experiments.runtime.output_dir import create_output_dir
from experiments.runtime.run_config import parse_overrides, resolve_config
from partitions.datasets import INPUT_SHAPES
from strategies.general_keys import DEVICES
from strategies.methods.registry import METHODS_BY_NAME, hand_over_client_halves
from strategies.methods.strategy_builder import build_client_schedule, build_strategy
from strategies.server_work import round_train_config

AUGMENTED = "+crop-flip"
REFERENCE = "fedavg"
NODE_ID = 1000  # the one client of the benchmark's cohort
SYNTHETIC_DATASET = "hf:synthetic"  # config placeholder when no built-in set has the input shape


# -- methods and their run configs ---------------------------------------------------------
def default_methods() -> str:
    """The methods' own cost-table entries (``MethodSpec.cost_table``), in declaration order."""
    return ",".join(entry for spec in METHODS_BY_NAME.values() for entry in spec.cost_table)


def method_overrides(method: str) -> dict[str, Any]:
    """Run-config keys of a method name: a strategy name or a method's cost-table entry
    (``gradaug-n2``: GradAug with ``gradaug-subnets = 2``), optionally followed by
    ``+crop-flip`` (the same with on-device crop and flip augmentation)."""
    if method.endswith(AUGMENTED):
        return {**method_overrides(method.removesuffix(AUGMENTED)), "augment": "crop-flip"}
    entries = {entry: (spec, keys) for spec in METHODS_BY_NAME.values() for entry, keys in spec.cost_table.items()}
    spec, keys = entries.get(method, (METHODS_BY_NAME.get(method), {}))
    if spec is None:
        raise UsageError(
            f"--methods: unknown method {method!r}; allowed: {', '.join(METHODS_BY_NAME)}, or a cost-table entry "
            f"({', '.join(e for e in entries if e not in METHODS_BY_NAME)}), each optionally followed by {AUGMENTED}"
        )
    # The methods derived from plain SGD are costed as their papers run them (no client momentum;
    # a plain_sgd that depends on the variant is true of the default one: FedMoSWA's paper variant).
    return {"strategy": spec.name, **keys, **({"momentum": 0.0} if spec.plain_sgd else {})}


def parse_methods(text: str) -> list[str]:
    """The comma-separated method names, FedAvg first (added when missing), no repeats."""
    methods = [m.strip() for m in text.split(",") if m.strip()]
    if not methods:
        raise UsageError(f"--methods: {text!r} names no method; allowed: a comma-separated list such as {default_methods()}")
    for method in methods:
        method_overrides(method)
    ordered = [REFERENCE] + [m for m in methods if m != REFERENCE]
    return list(dict.fromkeys(ordered))


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        shape = ()
    if not shape or any(side < 1 for side in shape):
        raise UsageError(f"--input-shape: {text!r} is not allowed; allowed: positive integers C,H,W such as 3,32,32")
    return shape


def dataset_for(input_shape: tuple[int, ...]) -> str:
    """A data set name for the run config with this input shape (only validation reads it)."""
    return next((name for name, shape in INPUT_SHAPES.items() if shape == tuple(input_shape)), SYNTHETIC_DATASET)


def method_config(method: str, model: str, input_shape: tuple[int, ...], batch_size: int, device: str,
                  overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The validated run config of a one-client federation running ``method``."""
    return resolve_config(
        {"model": model, "dataset": dataset_for(input_shape), "batch-size": batch_size, "device": device,
         "num-clients": 1, "participation": 1.0},
        overrides,
        method_overrides(method),
    )


# The model on which docs/methods.md's traffic column is measured: the FMNIST CNN (a method
# that needs a slimmable residual network, on ResNet-20-GN), synthetic examples of its shape.
TRAFFIC_MODEL, TRAFFIC_RESIDUAL_MODEL, TRAFFIC_SHAPE, TRAFFIC_CLASSES = "fmnist-cnn", "resnet20-gn", (1, 28, 28), 10


def traffic_in_models(method: str) -> tuple[float, float]:
    """(down, up): the bytes one client of ``method`` receives and sends in a round, as
    multiples of its model's (FedAvg: 1, 1), measured on ``TRAFFIC_MODEL``."""
    model = TRAFFIC_RESIDUAL_MODEL if METHODS_BY_NAME[method].model_needs == "slimmable-residual" else TRAFFIC_MODEL
    traffic = measure_traffic(method_config(method, model, TRAFFIC_SHAPE, 32, "cpu", {}), model, TRAFFIC_SHAPE,
                              TRAFFIC_CLASSES)
    return traffic.down / traffic.model, traffic.up / traffic.model


# -- the server side: the real training message ----------------------------------------------
class _OneNodeGrid:
    """The part of a Grid that ``configure_train`` uses: the connected node ids."""

    def get_node_ids(self) -> list[int]:
        return [NODE_ID]


def training_content(config: Mapping[str, Any], arrays: ArrayRecord) -> RecordDict:
    """The content of round 1's training message for the one client, from the strategy."""
    train_config = round_train_config(dict(config), build_client_schedule(config), 1)
    with server_side():
        strategy = build_strategy(config)
        strategy.bind_partitions({NODE_ID: 0}, 1, config["seed"])
        messages = list(strategy.configure_train(1, arrays, train_config, _OneNodeGrid()))
    if len(messages) != 1:
        raise RuntimeError(f"strategy {config['strategy']!r} sent {len(messages)} training messages to one client")
    return messages[0].content


# -- measurements -------------------------------------------------------------------------------
class SplitFlopCounter(FlopCounterMode):
    """FlopCounterMode that also keeps the FLOPs of forward ops apart.

    An op counts as backward when the autograd engine is running it (inside a graph
    task: ``torch._C._current_graph_task_id() != -1``), as forward otherwise.
    """

    def __init__(self):
        super().__init__(display=False)
        self.forward_flops = 0

    def __enter__(self):
        self.forward_flops = 0
        return super().__enter__()

    def _count_flops(self, func_packet, out, args, kwargs):
        if func_packet in self.flop_registry and torch._C._current_graph_task_id() == -1:
            self.forward_flops += self.flop_registry[func_packet](*args, **kwargs, out_val=out)
        return super()._count_flops(func_packet, out, args, kwargs)


def held_elements(model: nn.Module, local_round: LocalRound) -> tuple[int, int]:
    """(elements of the model's parameters and buffers, elements held in all with the
    round's objective, hooks and client-state objects), each tensor storage once."""
    storages: set[tuple[str, int]] = set()
    visited: set[int] = set()
    total = 0

    def count(tensor: torch.Tensor) -> None:
        nonlocal total
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        if storage.data_ptr() == 0 or key in storages:
            return
        storages.add(key)
        total += storage.nbytes() // tensor.element_size()

    def walk(obj: Any) -> None:
        if id(obj) in visited or obj is None or isinstance(obj, (str, bytes, int, float, bool, type)):
            return
        visited.add(id(obj))
        if isinstance(obj, torch.Tensor):
            count(obj)
        elif isinstance(obj, nn.Module):
            for tensor in (*obj.parameters(), *obj.buffers()):
                count(tensor)
        elif isinstance(obj, Mapping):
            for value in obj.values():
                walk(value)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for item in obj:
                walk(item)
        elif isinstance(obj, types.MethodType):
            walk(obj.__self__)
        elif isinstance(obj, types.FunctionType):
            for cell in obj.__closure__ or ():
                walk(cell.cell_contents)
        elif hasattr(obj, "__dict__") and type(obj).__module__.split(".")[0] in ("clients", "strategies"):
            walk(vars(obj))

    walk(model)
    model_elements = total
    walk(vars(local_round))
    return model_elements, total


@dataclass(frozen=True)
class MethodCost:
    method: str
    forward_flops: float  # per sample
    train_flops: float  # per sample
    model_elements: int
    held_elements: int
    peak_bytes: int | None
    seconds_per_step: float


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(method: str, config: Mapping[str, Any], model_name: str, input_shape: tuple[int, ...], num_classes: int,
            batch_size: int, steps: int, device: torch.device, count_flops: bool = True, timed: bool = True) -> MethodCost:
    """Cost of ``steps`` local steps of ``method`` on the real client path (without
    ``count_flops``, the FLOP columns are 0: only the time and parameters are measured;
    without ``timed``, ``seconds_per_step`` is 0: the warm-up step and the ``steps`` timed
    ones are left out, and the FLOPs are counted on the local round's first steps)."""
    hand_over_client_halves()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    torch.manual_seed(config["seed"])
    projection_head = uses_projection_head(model_name, method)
    server_model = build_model(model_name, input_shape, num_classes, projection_head)
    content = training_content(config, ArrayRecord(server_model.state_dict()))
    del server_model

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    # The client: its model on the device, loaded with the received weights (as the ClientApp).
    model = build_model(model_name, input_shape, num_classes, projection_head).to(device)
    model.load_state_dict(content["arrays"].to_torch_state_dict())
    data = torch.Generator().manual_seed(config["seed"])
    x = torch.randn(batch_size, *input_shape, generator=data).to(device)
    y = torch.randint(num_classes, (batch_size,), generator=data).to(device)
    generator = torch.Generator().manual_seed(config["seed"])
    local_round = LocalRound(model, content, RecordDict(), np.random.default_rng(config["seed"]), ClientInfo.of(y, num_classes))
    model_elements, held = held_elements(model, local_round)

    round_config = local_round.round_config  # the message's config record: set how many steps to run
    durations = [0.0]
    if timed:
        round_config[protocol.LOCAL_STEPS] = 1
        local_round.train(model, x, y, generator)  # warm-up
        durations = []
        for _ in range(steps):
            _synchronize(device)
            started = time.perf_counter()
            local_round.train(model, x, y, generator)  # ends by reading the loss: synchronised
            _synchronize(device)
            durations.append(time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None

    if not count_flops:
        return MethodCost(method, 0.0, 0.0, model_elements, held, peak, statistics.median(durations))
    round_config[protocol.LOCAL_STEPS] = steps
    counter = SplitFlopCounter()
    with counter:
        local_round.train(model, x, y, generator)
    samples = steps * batch_size
    return MethodCost(
        method, counter.forward_flops / samples, counter.get_total_flops() / samples, model_elements, held, peak,
        statistics.median(durations),
    )


def cost_table(costs: list[MethodCost], traffic: Mapping[str, RoundTraffic], round_steps: int = 0) -> pd.DataFrame:
    """One row per method, numeric columns; ratios relative to the FedAvg row. ``traffic``:
    each method's bytes per client and round, down and up."""
    reference = next(c for c in costs if c.method == REFERENCE)
    reference_traffic = traffic[REFERENCE]
    rows = []
    for c in costs:
        bytes_of = traffic[c.method]
        row = {
            "method": c.method,
            "fwd GFLOPs/sample": c.forward_flops / 1e9,
            "fwd ×": c.forward_flops / reference.forward_flops,
            "train GFLOPs/sample": c.train_flops / 1e9,
            "train ×": c.train_flops / reference.train_flops,
            "params held (M)": c.held_elements / 1e6,
            "params ×": c.held_elements / c.model_elements,
            "peak MiB": c.peak_bytes / 2**20 if c.peak_bytes is not None else None,
            "s/step": c.seconds_per_step,
            "time ×": c.seconds_per_step / reference.seconds_per_step,
            "down MiB/round": bytes_of.down / 2**20,
            "down ×": bytes_of.down / reference_traffic.down,
            "up MiB/round": bytes_of.up / 2**20,
            "up ×": bytes_of.up / reference_traffic.up,
        }
        if round_steps:
            row["s/round"] = c.seconds_per_step * round_steps
        rows.append(row)
    return pd.DataFrame(rows).set_index("method")


def format_table(table: pd.DataFrame) -> str:
    formats = {
        "fwd GFLOPs/sample": "{:.4f}", "train GFLOPs/sample": "{:.4f}", "params held (M)": "{:.3f}",
        "fwd ×": "{:.3f}", "train ×": "{:.3f}", "params ×": "{:.2f}", "time ×": "{:.2f}",
        "peak MiB": "{:.1f}", "s/step": "{:.4f}", "s/round": "{:.1f}", "down MiB/round": "{:.3f}", "down ×": "{:.2f}",
        "up MiB/round": "{:.3f}", "up ×": "{:.2f}",
    }
    shown = table.copy().astype(object)
    for column, fmt in formats.items():
        if column in shown:
            shown[column] = [("n/a" if v is None or pd.isna(v) else fmt.format(v)) for v in table[column]]
    return shown.to_string()


def run_costs(methods: list[str], model_name: str, input_shape: tuple[int, ...], num_classes: int, batch_size: int,
              steps: int, device: str, overrides: Mapping[str, Any] | None = None, round_steps: int = 0,
              progress: bool = False) -> pd.DataFrame:
    """Validate every method's config first, then measure each; return the numeric table."""
    methods = parse_methods(",".join(methods))
    configs = {m: method_config(m, model_name, input_shape, batch_size, device, overrides or {}) for m in methods}
    torch_device = select_device(device)
    costs, traffic = [], {}
    for method in methods:
        if progress:
            log.getChild("costs").info(f"{method} on {torch_device} …")
        costs.append(measure(method, configs[method], model_name, input_shape, num_classes, batch_size, steps, torch_device))
        traffic[method] = measure_traffic(configs[method], model_name, input_shape, num_classes)
    return cost_table(costs, traffic, round_steps)


# -- command line ---------------------------------------------------------------------------------
def _positive(option: str, value: int) -> int:
    if value < 1:
        raise UsageError(f"{option}: {value} is not allowed; allowed: an integer >= 1")
    return value



def run_command(args) -> int:
    """Validate the arguments, then measure and print the table (see the module docstring)."""
    if args.model not in MODEL_NAMES:
        raise UsageError(f"--model: {args.model!r} is not allowed; allowed: {', '.join(MODEL_NAMES)}")
    if args.device not in DEVICES:
        raise UsageError(f"--device: {args.device!r} is not allowed; allowed: {', '.join(DEVICES)}")
    methods = parse_methods(args.methods if args.methods is not None else default_methods())
    shape = parse_shape(args.input_shape)
    num_classes = _positive("--num-classes", args.num_classes)
    batch_size = _positive("--batch-size", args.batch_size)
    steps = _positive("--steps", args.steps)
    if args.threads < 0:
        raise UsageError(f"--threads: {args.threads} is not allowed; allowed: an integer >= 0 (0 = torch's default)")
    if args.round_steps < 0:
        raise UsageError(f"--round-steps: {args.round_steps} is not allowed; allowed: an integer >= 0")
    try:
        build_model(args.model, shape, num_classes)
    except ValueError as error:
        raise UsageError(
            f"--input-shape: {args.input_shape!r} does not fit --model {args.model!r} ({error}); "
            f"allowed: an input shape that model takes, or another --model"
        ) from None
    overrides = parse_overrides(args.set)
    for method in methods:
        method_config(method, args.model, shape, batch_size, args.device, overrides)
    device = select_device(args.device)
    if args.out:  # its folder is made (or refused) before the measurement, not after
        create_output_dir(args.out.parent, "--out")

    if args.threads:
        torch.set_num_threads(args.threads)
    table = run_costs(methods, args.model, shape, num_classes, batch_size, steps, args.device, overrides,
                      args.round_steps, progress=True)
    print(f"{args.model}, input {'x'.join(map(str, shape))}, {num_classes} classes, batch {batch_size}, "
          f"{steps} measured steps on {device}" + (f" ({torch.get_num_threads()} threads)" if device.type == "cpu" else ""))
    with pd.option_context("display.width", 200, "display.max_columns", None):
        print(format_table(table))
    if args.out:
        table.to_csv(args.out)
        print(f"table: {args.out.resolve()}")
    return 0


