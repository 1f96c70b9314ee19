"""The run config: every key, what it allows, and validation with clear errors.

Defaults live in ``pyproject.toml`` (``[tool.flwr.app.config]``); presets and
``--run-config`` override them. :func:`validate_run_config` is called by the launcher
before Flower or Ray start and again by the ServerApp (for plain ``flwr run .``), so a
bad value fails fast with the key, the value and what is allowed.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any

from clients.faults import FAULT_FORMAT, parse_faults
from clients.model_names import DEFAULT_MODEL, MODEL_NAMES, REQUIRED_INPUT, SEQUENCE_MODELS, SLIMMABLE_MODELS, resolve_model_name
from clients.options import ConfigError as ConfigError
from clients.options import Option
from clients.options import one_of as _one_of
from partitions.client_dirichlet import CONCENTRATIONS as CLIENT_CONCENTRATIONS
from partitions.client_dirichlet import EXHAUSTIONS as CLIENT_EXHAUSTIONS
from partitions.datasets import BUILTIN_DATASETS, INPUT_SHAPES, is_known_dataset
from partitions.stats import LABEL_SCHEMES, PARTITION_SCHEMES
from strategies.averaging import AVERAGING_SUBSETS
from strategies.method import averaging_start_round as averaging_start_round
from strategies.methods import AVERAGINGS, METHODS, method, method_options, refuse_broken_plugin
from strategies.privacy import DP_ORDERS
from strategies.schedules import EXPLORATIONS, LR_SCHEDULES
from strategies.tracking import TRACKERS, tracker_names

# Every declared method (strategies/methods.py): server-side methods, then methods that only
# change the clients' local objective.
STRATEGY_NAMES = tuple(METHODS)
# Methods that need a residual network with width-slimmable stages; methods whose objective
# works on one label per image (a representation per sample, mixed images), which excludes
# sequence models (next-character prediction).
RESIDUAL_ONLY = tuple(name for name, spec in METHODS.items() if spec.model_needs == "slimmable-residual")
IMAGE_ONLY = tuple(name for name, spec in METHODS.items() if spec.model_needs != "any")
AVERAGING_NAMES = ("none", *AVERAGINGS)
# IMA on FedAdam/FedYogi/FedAdagrad: the window of FMA aggregates is the target of the
# optimiser's step (the IMA authors' code), or the window of the optimiser's outputs is sent.
IMA_SERVER_OPT_ORDERINGS = ("fma-target", "output-window")
DEVICES = ("auto", "cpu", "cuda")
# Local data augmentation: none, or random crop (padding 4) + horizontal flip (clients/augmentation.py).
AUGMENTATIONS = ("none", "crop-flip")


# Plausible bounds: far beyond any paper's setup (10,000 rounds, 20 local epochs), short of
# values that would only run until killed.
MAX_ROUNDS, MAX_LOCAL_EPOCHS, MAX_BATCH = 1_000_000, 10_000, 1_000_000
# crop-flip pads 4 pixels (of the papers' 32-pixel CIFAR images): smaller images lose too much.
MIN_CROP_FLIP_SIDE = 24

# More torch threads than any machine here has cores is a typo.
MAX_TORCH_THREADS = 1024

# Flower carries run-config integers as signed 64-bit values.
INT64_RANGE = (-(2**63), 2**63 - 1)
# Discovery waits for every client process to start and answer: less cannot succeed.
MIN_NODE_TIMEOUT_S = 10.0


def _parses_as_faults(spec: str) -> bool:
    try:
        parse_faults(spec)
    except ValueError:
        return False
    return True


def _server_lr_defaults() -> str:
    """The methods whose server-lr = 0 means something other than 1, grouped by value."""
    by_value: dict[float, list[str]] = {}
    for name, spec in METHODS.items():
        if spec.default_server_lr != 1.0:
            by_value.setdefault(spec.default_server_lr, []).append(name)
    return ", ".join(f"{value:g} for {'/'.join(names)}" for value, names in by_value.items())


SCHEMA: dict[str, Option] = {
    "dataset": Option(str, f"one of {', '.join(BUILTIN_DATASETS)} or 'hf:<hub id or local path>'", is_known_dataset),
    "data-dir": Option(str, "a directory path, or '' for the default location"),
    "model": Option(str, "'auto' (the data set's default: " + ", ".join(f"{data} {model}" for data, model in DEFAULT_MODEL.items())
                    + ", any other cifar-cnn) or one of " + ", ".join(repr(name) for name in MODEL_NAMES),
                    lambda v: v == "auto" or v in MODEL_NAMES, ("auto", *MODEL_NAMES)),
    "partition": _one_of(*PARTITION_SCHEMES),
    "alpha": Option(float, "a number >= 0 (Dirichlet concentration; 0 = one class per client)", lambda v: v >= 0),
    "classes-per-client": Option(int, "an integer >= 1", lambda v: v >= 1),
    "pachinko-alpha": Option(float, "a number > 0 (Pachinko: each client's Dirichlet over coarse labels)", lambda v: v > 0),
    "pachinko-beta": Option(float, "a number > 0 (Pachinko: each client's Dirichlet over a coarse label's fine labels)", lambda v: v > 0),
    "clients-per-domain": Option(int,
            "an integer >= 0 (> 0: split each domain of a multi-domain data set into this many clients with the "
            "label scheme of 'partition'; num-clients = this × domains)", lambda v: v >= 0),
    "dirichlet-balance": Option(bool,
            "true or false (NIID-Bench/FedLab rule: a client holding >= N/K samples gets no share of later "
            "classes)"),
    "client-dirichlet-concentration": _one_of(*CLIENT_CONCENTRATIONS),
    "client-dirichlet-exhaustion": _one_of(*CLIENT_EXHAUSTIONS),
    "samples-per-client": Option(int,
            "an integer >= 0 (partition = 'dirichlet-client': samples each client receives; 0 = N/K)", lambda v: v >= 0),
    "min-partition-size": Option(int, "an integer >= 0", lambda v: v >= 0),
    "num-clients": Option(int, "an integer >= 1", lambda v: v >= 1),
    "participation": Option(float, "a number in (0, 1]", lambda v: 0 < v <= 1),
    "num-rounds": Option(int, f"an integer from 1 to {MAX_ROUNDS:,}", lambda v: 1 <= v <= MAX_ROUNDS),
    "local-epochs": Option(int, f"an integer from 1 to {MAX_LOCAL_EPOCHS:,}", lambda v: 1 <= v <= MAX_LOCAL_EPOCHS),
    "batch-size": Option(int, f"an integer from 1 to {MAX_BATCH:,}", lambda v: 1 <= v <= MAX_BATCH),
    "lr": Option(float, "a number > 0", lambda v: v > 0),
    "lr-schedule": _one_of(*LR_SCHEDULES),
    "lr-decay": Option(float,
            "a number in (0, 1] (lr-schedule = exponential: client lr of round t is lr * lr-decay^(t-1))", lambda v: 0 < v <= 1),
    "momentum": Option(float, "a number in [0, 1)", lambda v: 0 <= v < 1),
    "weight-decay": Option(float, "a number >= 0", lambda v: v >= 0),
    "nesterov": Option(bool, "true or false (Nesterov momentum in local SGD, as FedAlign's code; needs momentum > 0)"),
    "cuda-graphs": Option(bool,
            "true or false (on CUDA, capture the local step once per client process and replay it for every full "
            "batch; false: eager steps)"),
    "augment": _one_of(*AUGMENTATIONS),
    "normalize": Option(bool, "true or false (standardise each channel with the training split's mean and std; false: pixels in [0, 1])"),
    "grad-clip": Option(float, "a number >= 0 (max gradient norm; 0 = no clipping)", lambda v: v >= 0),
    "strategy": _one_of(*STRATEGY_NAMES),
    "server-lr": Option(float,
            f"a number >= 0 (0 = the method's default: {_server_lr_defaults()}, else 1; FedSWA's α)", lambda v: v >= 0),
    **method_options(),
    "averaging": _one_of(*AVERAGING_NAMES),
    "window": Option(int, "an integer >= 1 (IMA's P, WIMA's W)", lambda v: v >= 1),
    "avg-start": Option(float, "a fraction of num-rounds in (0, 1), or a round number >= 1 (IMA t_s, SWA start)", lambda v: v > 0),
    "avg-feedback": Option(bool, "true or false (WIMA: send the averaged model to clients)"),
    "avg-subset": _one_of(*AVERAGING_SUBSETS),
    "ima-exploration": _one_of(*EXPLORATIONS),
    "ima-server-opt": _one_of(*IMA_SERVER_OPT_ORDERINGS),
    "ima-decay": Option(float, "a number in (0, 1] (client lr factor per round after t_s)", lambda v: 0 < v <= 1),
    "swa-variant": _one_of("paper", "official-code"),
    "swa-cycle": Option(int, "an integer >= 1 (SWA lr cycle length in rounds)", lambda v: v >= 1),
    "dp-clipping-norm": Option(float,
            "a number >= 0 (server-side differential privacy, Flower's DifferentialPrivacyServerSideFixedClipping: "
            "clip each client's update to this L2 norm C and add Gaussian noise to the aggregate; 0 = off)",
            lambda v: v >= 0),
    "dp-noise-multiplier": Option(float,
            "a number >= 0 (σ: the noise's standard deviation is σ·C/m, m the cohort; needs dp-clipping-norm > 0)",
            lambda v: v >= 0),
    "dp-order": Option(str, "'inside' (averaging of the private base models: the noise is added to each base "
            "model) or 'outside' (the noise is added once, to what the averaging rule returns)",
            lambda v: v in DP_ORDERS, DP_ORDERS),
    "seed": Option(int, "an integer >= 0", lambda v: v >= 0),
    "target-accuracy": Option(float, "a number in [0, 1]", lambda v: 0 <= v <= 1),
    "summary-last-k": Option(int,
            "an integer >= 1 (rounds averaged in the summary: the paper setup's horizon, the same for every run "
            "of a comparison; WIMA's presets 100, the others 10)", lambda v: v >= 1),
    "device": _one_of(*DEVICES),
    "torch-threads": Option(int,
            f"an integer from 0 to {MAX_TORCH_THREADS} (torch's intra-op threads in every client process, whatever"
            f" --cpus-per-client gives a client, so that results do not depend on how the machine is shared; 0 = "
            f"torch's own choice, which follows Ray's CPUs per client)", lambda v: 0 <= v <= MAX_TORCH_THREADS),
    "server-torch-threads": Option(int,
            f"an integer from 0 to {MAX_TORCH_THREADS} (torch's intra-op threads of the ServerApp's aggregation "
            f"and central evaluation, which run while the clients wait; fixed like torch-threads; 0 = torch's own "
            f"choice, the machine's cores)", lambda v: 0 <= v <= MAX_TORCH_THREADS),
    "cuda-deterministic": Option(bool,
            "true or false (on CUDA: deterministic cuDNN and torch kernels, no TF32, the same bits for any number"
            " of processes sharing a GPU; false: cuDNN's fastest kernels and TF32, results may differ in the last"
            " bits)"),
    "output-dir": Option(str, "a directory path, or '' for ~/basin-runs/<run id>"),
    "round-timeout": Option(float,
            "a number of seconds > 0 (a client without a reply by then counts as failed; in a simulation the "
            "first round after a start also gets node-timeout, for the client processes to start)", lambda v: v > 0),
    "node-timeout": Option(float,
            f"a number of seconds >= {MIN_NODE_TIMEOUT_S:g} (wait this long for num-clients nodes to connect and "
            f"report their partition, then fail; client processes take seconds to start)", lambda v: v >= MIN_NODE_TIMEOUT_S),
    "dead-nodes": Option(str,
            "'sample' (a node Flower reports unavailable keeps its partition in the seeded sampling, counted "
            "failed when drawn: the cohorts stay the config's) or 'skip' (its partition is left out of the "
            "sampling until it rejoins; cohorts then depend on when nodes died)", lambda v: v in ("sample", "skip")),
    "min-replies": Option(int,
            "an integer >= 1, at most the cohort size (a round with fewer accepted replies is skipped)", lambda v: v >= 1),
    "checkpoint-every": Option(int,
            "an integer >= 0 (write output-dir/checkpoint.pt every k rounds and after the last; 0 = never)", lambda v: v >= 0),
    "save-models-every": Option(int,
            "an integer >= 0 (save the base, averaged and client models to output-dir/models every k rounds, "
            "after the last save-models-last rounds and at the end; 0 = never)", lambda v: v >= 0),
    "save-models-last": Option(int,
            "an integer >= 0 (with save-models-every > 0: also save each of the last this-many rounds)", lambda v: v >= 0),
    "save-client-models": Option(int,
            "an integer >= 0 (client models kept per saved round, the first in partition order)", lambda v: v >= 0),
    "round-indicators": Option(bool, "true or false (add IMA's locality and client-model CKA to results.csv every round)"),
    "client-evaluation": Option(float,
            "a fraction in [0, 0.5] (0 = off; else each client holds out this seeded fraction of its partition, "
            "trains on the rest, and reports the received model's accuracy on it every round: results.csv's "
            "client-accuracy-mean, -worst-10pct and -std across the cohort)", lambda v: 0 <= v <= 0.5),
    "resume": Option(bool, "true or false (continue from output-dir/checkpoint.pt when there is one)"),
    "fault-injection": Option(str, f"'' or {FAULT_FORMAT}", _parses_as_faults),
    "track": Option(str,
            f"'' or a comma-separated list of {', '.join(TRACKERS)} (log the config, every round and the summary "
            f"to these experiment trackers; the optional extra 'tracking')",
            lambda v: all(name in TRACKERS for name in tracker_names(v))),
    "track-dir": Option(str, "a directory path, or '' for output-dir (where TensorBoard, MLflow and W&B write)"),
    "track-group": Option(str, "a name, or '' for output-dir's name (the MLflow experiment, the W&B group)"),
}


def _coerce(key: str, value: Any) -> Any:
    option = SCHEMA[key]
    ok_type = isinstance(value, option.kind) and (option.kind is bool) == isinstance(value, bool)
    if option.kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok_type = float(value), True
    if not ok_type:
        raise ConfigError(
            f"run config key '{key}' = {value!r} has type {type(value).__name__}; "
            f"allowed: {option.allowed}"
        )
    if option.kind is float and not math.isfinite(value):
        raise ConfigError(f"run config key '{key}' = {value!r} is not a finite number; allowed: {option.allowed}")
    if option.kind is int and not INT64_RANGE[0] <= value <= INT64_RANGE[1]:
        raise ConfigError(
            f"run config key '{key}' = {value!r} does not fit a signed 64-bit integer (Flower's run config); "
            f"allowed: {option.allowed}, below 2^63"
        )
    if not option.check(value):
        guess = difflib.get_close_matches(value, option.choices, n=1) if option.choices and isinstance(value, str) else []
        hint = f" (did you mean {guess[0]!r}?)" if guess else ""
        raise ConfigError(f"run config key '{key}' = {value!r} is not allowed{hint}; allowed: {option.allowed}")
    return value


def validate_run_config(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """Return a checked copy of the run config or raise :class:`ConfigError`."""
    for key in ("strategy", "averaging"):
        refuse_broken_plugin(key, run_config.get(key))
    unknown = sorted(set(run_config) - set(SCHEMA))
    if unknown:
        guesses = [f"'{k}' (did you mean '{m[0]}'?)" if (m := difflib.get_close_matches(k, SCHEMA, n=1)) else f"'{k}'"
                   for k in unknown]
        raise ConfigError(f"unknown run config key(s) {', '.join(guesses)}; allowed keys: {', '.join(SCHEMA)}")
    missing = sorted(set(SCHEMA) - set(run_config))
    if missing:
        raise ConfigError(f"run config is missing key(s) {', '.join(missing)}")
    config = {key: _coerce(key, value) for key, value in run_config.items()}

    model = resolve_model_name(config["model"], config["dataset"])
    needed, has = REQUIRED_INPUT.get(model), INPUT_SHAPES.get(config["dataset"])
    if needed and has and needed != has:
        raise ConfigError(
            f"run config key 'model' = {config['model']!r} needs {needed} inputs but dataset "
            f"{config['dataset']!r} has {has}; allowed for it: 'auto' or a model that fits"
        )
    if config["strategy"] in RESIDUAL_ONLY and model not in SLIMMABLE_MODELS:
        raise ConfigError(
            f"run config key 'model' = {config['model']!r} (resolved to {model!r}) cannot run strategy = "
            f"{config['strategy']!r}, which needs a residual network with width-slimmable stages; "
            f"allowed: {', '.join(SLIMMABLE_MODELS)}"
        )
    if model in SEQUENCE_MODELS and (config["strategy"] in IMAGE_ONLY or config["augment"] != "none"):
        what = f"strategy = {config['strategy']!r}" if config["strategy"] in IMAGE_ONLY else f"augment = {config['augment']!r}"
        raise ConfigError(
            f"run config key 'model' = {model!r} (next-character prediction) cannot run {what}, which works on one "
            f"label per image; allowed: a strategy other than {', '.join(IMAGE_ONLY)}, augment = 'none'"
        )
    if config["dp-noise-multiplier"] > 0 and config["dp-clipping-norm"] == 0:
        raise ConfigError(
            f"run config key 'dp-noise-multiplier' = {config['dp-noise-multiplier']:g} needs a clipping norm (the "
            f"noise's scale is σ·C/m), but dp-clipping-norm = 0; allowed: dp-clipping-norm > 0, or "
            f"dp-noise-multiplier = 0"
        )
    if config["clients-per-domain"] and config["partition"] not in LABEL_SCHEMES:
        raise ConfigError(
            f"run config key 'clients-per-domain' = {config['clients-per-domain']} splits domains with a label scheme, "
            f"but partition = {config['partition']!r}; allowed: partition one of {', '.join(LABEL_SCHEMES)}, or 0"
        )
    if config["clients-per-domain"] and config["num-clients"] % config["clients-per-domain"]:
        raise ConfigError(
            f"run config key 'num-clients' = {config['num-clients']} is not a multiple of clients-per-domain = "
            f"{config['clients-per-domain']}; allowed: clients-per-domain × the number of domains"
        )
    if config["nesterov"] and config["momentum"] == 0:
        raise ConfigError(
            f"run config key 'nesterov' = true needs momentum > 0 (momentum = {config['momentum']}); "
            f"allowed: nesterov = false, or momentum in (0, 1)"
        )
    spec = method(config["strategy"])
    if spec.steps_plain_sgd(config) and config["momentum"] > 0:
        own = [key for key in spec.options if key.endswith("-momentum")]
        raise ConfigError(
            f"run config key 'momentum' = {config['momentum']} would stack client heavy-ball momentum on "
            f"{config['strategy']}'s own term, whose paper steps with plain SGD; allowed: momentum = 0 "
            f"(--set momentum=0){f' (the method momentum is {own[0]})' if own else ''}"
        )
    if spec.check is not None:
        spec.check(config)
    if config["augment"] != "none" and len(INPUT_SHAPES.get(config["dataset"], (3, 32, 32))) != 3:
        raise ConfigError(f"run config key 'augment' = {config['augment']!r} needs image inputs; allowed: 'none'")
    side = min(INPUT_SHAPES.get(config["dataset"], (3, 32, 32))[1:] or (0,))
    if config["augment"] == "crop-flip" and side < MIN_CROP_FLIP_SIDE:
        raise ConfigError(
            f"run config key 'augment' = 'crop-flip' pads 4 pixels of each side of {config['dataset']}'s {side}×{side} "
            f"images, too small to crop from (it trains at chance); allowed: 'none', or images of at least "
            f"{MIN_CROP_FLIP_SIDE} px (fashion-mnist, cifar10, cifar100)"
        )
    if model in SEQUENCE_MODELS and config["dataset"] in INPUT_SHAPES:
        raise ConfigError(
            f"run config key 'model' = {model!r} predicts characters; dataset {config['dataset']!r} holds images; "
            f"allowed: an image model ({', '.join(m for m in MODEL_NAMES if m not in SEQUENCE_MODELS)}) or 'auto'"
        )
    if config["data-dir"] and config["dataset"] != "fashion-mnist":
        raise ConfigError(
            f"run config key 'data-dir' = {config['data-dir']!r} is read only for dataset = 'fashion-mnist' "
            f"(dataset here: {config['dataset']!r}); allowed: '' (a hub set's local copy: dataset = 'hf:/path')"
        )
    if round(config["participation"] * config["num-clients"]) < 1:
        raise ConfigError(
            f"run config key 'participation' = {config['participation']} samples no client out of "
            f"num-clients = {config['num-clients']}; allowed: participation * num-clients >= 0.5"
        )
    if config["avg-start"] >= 1 and (config["avg-start"] != int(config["avg-start"]) or config["avg-start"] > config["num-rounds"]):
        raise ConfigError(
            f"run config key 'avg-start' = {config['avg-start']!r} is not allowed; allowed: a fraction in (0, 1) "
            f"or a whole round number between 1 and num-rounds = {config['num-rounds']}"
        )
    if config["averaging"] != "none" and (rule := AVERAGINGS[config["averaging"]]).check is not None:
        rule.check(config)
    if config["min-replies"] > cohort_size(config):
        raise ConfigError(
            f"run config key 'min-replies' = {config['min-replies']} exceeds the cohort size {cohort_size(config)} "
            f"(participation * num-clients); allowed: 1..{cohort_size(config)}"
        )
    outside = sorted({f.partition_id for f in parse_faults(config["fault-injection"])} - set(range(config["num-clients"])))
    if outside:
        raise ConfigError(
            f"run config key 'fault-injection' = {config['fault-injection']!r} names partition(s) {outside}; "
            f"allowed: partitions 0..{config['num-clients'] - 1}"
        )
    return config


def summary_horizon(config: Mapping[str, Any]) -> int:
    """Rounds averaged in the summary: ``summary-last-k``, a setting of the paper's setup
    (its presets and sweeps), never of the method, so every run of one comparison reports
    the same metric (WIMA's paper averages the last 100 rounds for all its methods)."""
    return config["summary-last-k"]


def cohort_size(config: Mapping[str, Any]) -> int:
    """Clients sampled per round: participation · K rounded, at least one."""
    return max(1, round(config["participation"] * config["num-clients"]))
