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

from clients.faults import parse_faults
from clients.model_names import (
    GROUP_NORM_COUNTERPART,
    MODEL_NAMES,
    REQUIRED_INPUT,
    SEQUENCE_MODELS,
    SLIMMABLE_MODELS,
    resolve_model_name,
)
from clients.model_plugins import BROKEN_MODELS, MODEL_OFFERS, MODEL_PLUGINS, ModelSpec
from clients.options import ConfigError as ConfigError
from clients.options import Option
from clients.options import one_of as _one_of
from partitions.datasets import INPUT_SHAPES, TEXT_DATASETS
from partitions.stats import LABEL_SCHEMES
from strategies.cohort import cohort_size
from strategies.general_keys import AVERAGING_AND_RUN, DATA_AND_TRAINING, DEFAULT_PARTICIPATION
from strategies.methods.registry import AVERAGINGS_BY_NAME, METHODS_BY_NAME, method, method_options, refuse_broken_plugin
from strategies.system_clock import read_trace

# Every declared method (strategies/methods/registry.py): server-side methods, then methods that only
# change the clients' local objective.
STRATEGY_NAMES = tuple(METHODS_BY_NAME)
# No averaging, then every declared averaging rule.
AVERAGING_NAMES = ("none", *AVERAGINGS_BY_NAME)
# crop-flip pads 4 pixels (of the papers' 32-pixel CIFAR images): smaller images lose too much.
MIN_CROP_FLIP_SIDE = 24
# Flower carries run-config integers as signed 64-bit values.
INT64_RANGE = (-(2**63), 2**63 - 1)


def _server_lr_defaults() -> str:
    """The methods whose server-lr = 0 means something other than 1, grouped by value."""
    by_value: dict[float, list[str]] = {}
    for name, spec in METHODS_BY_NAME.items():
        if spec.default_server_lr != 1.0:
            by_value.setdefault(spec.default_server_lr, []).append(name)
    return ", ".join(f"{value:g} for {'/'.join(names)}" for value, names in by_value.items())


SCHEMA: dict[str, Option] = {
    **DATA_AND_TRAINING,
    "strategy": _one_of(*STRATEGY_NAMES),
    "server-lr": Option(float,
            f"a number >= 0 (0 = the method's default: {_server_lr_defaults()}, else 1; FedSWA's α)", lambda v: v >= 0),
    **method_options(),
    "averaging": _one_of(*AVERAGING_NAMES),
    **AVERAGING_AND_RUN,
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
    if (model := run_config.get("model")) in BROKEN_MODELS:
        raise ConfigError(f"run config key 'model' = {model!r}: {BROKEN_MODELS[model].line()}")
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
    needs = METHODS_BY_NAME[config["strategy"]].model_needs  # what its declaration says it needs of a model
    if needs == "slimmable-residual" and model not in SLIMMABLE_MODELS:
        raise ConfigError(
            f"run config key 'model' = {config['model']!r} (resolved to {model!r}) cannot run strategy = "
            f"{config['strategy']!r}, which needs a residual network with width-slimmable stages; "
            f"allowed: {', '.join(SLIMMABLE_MODELS)}"
        )
    if model in MODEL_PLUGINS:
        _check_model_plugin(MODEL_PLUGINS[model], config)
    if model in SEQUENCE_MODELS and (needs != "any" or config["augment"] != "none"):
        what = f"strategy = {config['strategy']!r}" if needs != "any" else f"augment = {config['augment']!r}"
        image_only = [name for name, spec in METHODS_BY_NAME.items() if spec.model_needs != "any"]
        raise ConfigError(
            f"run config key 'model' = {model!r} (next-character prediction) cannot run {what}, which works on one "
            f"label per image; allowed: a strategy other than {', '.join(image_only)}, augment = 'none'"
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
    if config["dp-clipping-norm"] > 0:
        _check_privacy(config, model)
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
    if config["clients-per-round"] > config["num-clients"]:
        raise ConfigError(
            f"run config key 'clients-per-round' = {config['clients-per-round']} exceeds num-clients = "
            f"{config['num-clients']}; allowed: 0 (participation · num-clients) or 1..{config['num-clients']}"
        )
    if config["clients-per-round"] > 0 and config["participation"] != DEFAULT_PARTICIPATION:
        raise ConfigError(
            f"run config key 'clients-per-round' = {config['clients-per-round']} and participation = "
            f"{config['participation']} both set the cohort; allowed: one of them (clients-per-round = 0, or "
            f"participation left at its default {DEFAULT_PARTICIPATION})"
        )
    if config["clients-per-round"] == 0 and round(config["participation"] * config["num-clients"]) < 1:
        raise ConfigError(
            f"run config key 'participation' = {config['participation']} samples no client out of "
            f"num-clients = {config['num-clients']}; allowed: participation * num-clients >= 0.5"
        )
    if config["avg-start"] >= 1 and (config["avg-start"] != int(config["avg-start"]) or config["avg-start"] > config["num-rounds"]):
        raise ConfigError(
            f"run config key 'avg-start' = {config['avg-start']!r} is not allowed; allowed: a fraction in (0, 1) "
            f"or a whole round number between 1 and num-rounds = {config['num-rounds']}"
        )
    if config["averaging"] != "none" and (rule := AVERAGINGS_BY_NAME[config["averaging"]]).check is not None:
        rule.check(config)
    if config["evaluation"] == "federated":
        _check_federated_evaluation(config)
    _check_participation_and_clock(config)
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


def _check_federated_evaluation(config: Mapping[str, Any]) -> None:
    """Federated evaluation needs each node's test split, and the server, which holds no data,
    cannot compute what needs its test set or its pixel statistics."""
    if config["client-evaluation"] <= 0:
        raise ConfigError(
            "run config key 'evaluation' = 'federated' scores each sampled node's test split: its data's own "
            "test split, else a seeded hold-out of client-evaluation of its examples; client-evaluation = 0 "
            "gives none; allowed: client-evaluation in (0, 0.5] (e.g. --set client-evaluation=0.2)"
        )
    server_data = [key for key, off in (("round-indicators", False), ("augment", "none")) if config[key] != off]
    if server_data:
        raise ConfigError(
            f"run config key 'evaluation' = 'federated': {', '.join(f'{k} = {config[k]!r}' for k in server_data)} "
            f"needs the server's test set (round-indicators: its first samples; augment: its pixel statistics), "
            f"which federated evaluation does not read; allowed: round-indicators = false, augment = 'none', or "
            f"evaluation = 'central'"
        )


def _check_participation_and_clock(config: Mapping[str, Any]) -> None:
    """The participation model's and the simulated clock's keys together (each alone is checked by its Option)."""
    model = config["participation-model"]
    if config["availability-min"] > config["availability-max"]:
        raise ConfigError(
            f"run config key 'availability-min' = {config['availability-min']:g} exceeds availability-max = "
            f"{config['availability-max']:g}; allowed: availability-min <= availability-max"
        )
    needs_data = model == "data-correlated" or (model == "availability" and config["availability-source"] == "data-size")
    if needs_data and config["evaluation"] == "federated":
        what = "'data-correlated'" if model == "data-correlated" else "'availability' with availability-source = 'data-size'"
        raise ConfigError(
            f"run config key 'participation-model' = {what} needs each client's label counts or size on the server, "
            f"which under evaluation = 'federated' holds no data; allowed: participation-model 'uniform', 'cyclic', "
            f"or 'availability' with availability-source = 'random'"
        )
    if model == "cyclic" and config["cyclic-groups"] > config["num-clients"]:
        raise ConfigError(
            f"run config key 'cyclic-groups' = {config['cyclic-groups']} exceeds num-clients = {config['num-clients']} "
            f"(a group would be empty); allowed: 2..{config['num-clients']}"
        )
    speeds, policy, deadline = config["system-speeds"], config["straggler-policy"], config["round-deadline"]
    if policy != "wait" and (speeds == "none" or deadline == 0):
        raise ConfigError(
            f"run config key 'straggler-policy' = {policy!r} acts at round-deadline on the simulated clock, but "
            f"system-speeds = {speeds!r} and round-deadline = {deadline:g}; allowed: system-speeds 'lognormal' or "
            f"'trace' with round-deadline > 0, or straggler-policy = 'wait'"
        )
    if deadline > 0 and policy == "wait":
        raise ConfigError(
            f"run config key 'round-deadline' = {deadline:g} does nothing under straggler-policy = 'wait'; allowed: "
            f"round-deadline = 0, or straggler-policy 'deadline' or 'partial'"
        )
    if (speeds == "trace") != bool(config["speed-trace"]):
        raise ConfigError(
            f"run config key 'speed-trace' = {config['speed-trace']!r} with system-speeds = {speeds!r}; allowed: a "
            f"trace file exactly when system-speeds = 'trace'"
        )
    if speeds == "trace":
        try:
            read_trace(config["speed-trace"])
        except ValueError as error:
            raise ConfigError(f"run config key 'speed-trace': {error}") from None


def _check_model_plugin(spec: ModelSpec, config: Mapping[str, Any]) -> None:
    """A model plug-in's declared inputs against the data set, and what it offers against
    what the method needs (``model_needs = "image"``: a representation and a classifier)."""
    # The built-in sets are images, TEXT_DATASETS text; another hub set's kind is known once loaded
    # (clients/models/__init__.py checks the plug-in against it as the model is first built).
    images = config["dataset"] in INPUT_SHAPES
    if spec.inputs == "sequence" and (images or config["augment"] != "none"):
        raise ConfigError(
            f"run config key 'model' = {spec.name!r} (a plug-in) takes token sequences; dataset {config['dataset']!r} "
            f"with augment = {config['augment']!r} gives images; allowed: an image model, or a text data set"
        )
    if spec.inputs == "image" and config["dataset"] in TEXT_DATASETS:
        raise ConfigError(
            f"run config key 'model' = {spec.name!r} (a plug-in) takes images; dataset {config['dataset']!r} holds "
            f"next-character text (token sequences); allowed: a model plug-in declaring inputs = 'sequence', or "
            f"'char-lstm'"
        )
    needs = method(config["strategy"]).model_needs
    lacking = sorted(set(MODEL_OFFERS) - set(spec.offers))
    if needs == "image" and (spec.inputs != "image" or lacking):
        what = "takes token sequences" if spec.inputs != "image" else f"does not offer {', '.join(lacking)}"
        raise ConfigError(
            f"run config key 'model' = {spec.name!r} (a plug-in) {what}, but strategy = {config['strategy']!r} works on "
            f"one label per image with the model's representation and classifier; allowed: a model plug-in declaring "
            f"inputs = 'image' and offers = {{{', '.join(MODEL_OFFERS)}}}, or one of Basin's models"
        )


def _check_privacy(config: Mapping[str, Any], model: str) -> None:
    """What server-side DP (strategies/privacy.py) can make private: the methods whose clients
    send only their model and whose aggregate is a mean (their declarations), a model without
    buffers, and outside an averaging rule only where each release is a convex combination of
    base models that the clients receive."""
    spec = method(config["strategy"])
    norm = f"run config key 'dp-clipping-norm' = {config['dp-clipping-norm']:g}"
    private = sorted(name for name, other in METHODS_BY_NAME.items()
                     if other.dp_aggregate != "own" and not other.reply_records)
    if spec.reply_records:
        name, holds = next(iter(spec.reply_records.items()))
        raise ConfigError(
            f"{norm} clips and noises each client's model update only, but strategy = {config['strategy']!r} also "
            f"sends '{name}' ({holds}), which would leave the client unclipped and un-noised; allowed: "
            f"dp-clipping-norm = 0, or a strategy that sends only its model"
        )
    if spec.dp_aggregate == "own":
        raise ConfigError(
            f"{norm} makes the aggregate the mean of the clipped updates over the m sampled clients, but strategy = "
            f"{config['strategy']!r} aggregates by its own rule (its declaration's dp_aggregate = 'own'), whose "
            f"sensitivity the noise σ·C/m does not cover; allowed: dp-clipping-norm = 0, or one of {', '.join(private)}"
        )
    refuse_buffers_under_dp(model, config)
    if config["participation-model"] != "uniform":
        raise ConfigError(
            f"{norm} accounts ε for a cohort sampled uniformly from all num-clients clients, but participation-model "
            f"= {config['participation-model']!r} samples from the round's available ones, a sampling the accountant's "
            f"amplification does not cover; allowed: participation-model = 'uniform', or dp-clipping-norm = 0"
        )
    rule = config["averaging"]
    if config["dp-order"] != "outside" or rule == "none":
        return
    order = f"run config key 'dp-order' = 'outside' adds the noise to what averaging = {rule!r} returns"
    if spec.dp_aggregate != "mean":
        raise ConfigError(
            f"{order}, after strategy = {config['strategy']!r}'s server step, whose output's sensitivity is not C/m; "
            f"allowed: dp-order = 'inside' (the step then takes the noisy mean)"
        )
    if not AVERAGINGS_BY_NAME[rule].sends_average(config):
        raise ConfigError(
            f"{order}, the models it sends, but its final model, an average of noise-free base models that no client "
            f"receives, is never noised; allowed: dp-order = 'inside'"
            f"{', or avg-feedback = true' if 'avg-feedback' in config and rule in ('wima', 'ema') else ''}"
        )
    if config["avg-subset"] != "all":
        raise ConfigError(
            f"{order}, but avg-subset = {config['avg-subset']!r} mixes the average's and the newest base model's "
            f"parameters, whose sum can move by more than C/m; allowed: dp-order = 'inside', or avg-subset = 'all'"
        )


def refuse_buffers_under_dp(model: str, config: Mapping[str, Any], buffers: list[str] | None = None) -> None:
    """ConfigError where server-side DP would clip and noise a model's buffers (BatchNorm's
    running statistics): ``buffers`` the built model's, else the built-in's declaration, else
    (a plug-in) the buffers of the plug-in built for the data set's inputs."""
    if buffers is None:
        if model in GROUP_NORM_COUNTERPART:
            buffers = ["running_mean", "running_var", "num_batches_tracked"]
        elif model in MODEL_PLUGINS and config["dataset"] in INPUT_SHAPES:
            built = MODEL_PLUGINS[model](10, INPUT_SHAPES[config["dataset"]])
            buffers = [name for name, _ in built.named_buffers()]
    if not buffers:
        return
    instead = (f"the GroupNorm model {GROUP_NORM_COUNTERPART[model]!r}" if model in GROUP_NORM_COUNTERPART
               else "a model with GroupNorm in place of BatchNorm")
    raise ConfigError(
        f"run config key 'model' = {model!r} holds buffers ({', '.join(buffers[:3])}{', …' if len(buffers) > 3 else ''}),"
        f" which server-side DP (dp-clipping-norm = {config['dp-clipping-norm']:g}) cannot clip or noise as model "
        f"updates, and which un-noised would leak the data they summarise; allowed: {instead}, or dp-clipping-norm = 0"
    )


def summary_horizon(config: Mapping[str, Any]) -> int:
    """Rounds averaged in the summary: ``summary-last-k``, a setting of the paper's setup
    (its presets and sweeps), never of the method, so every run of one comparison reports
    the same metric (WIMA's paper averages the last 100 rounds for all its methods)."""
    return config["summary-last-k"]
