"""Basin's general run-config keys: what each allows, whatever the method.

Every key except the methods' own (their declarations hold those: strategies/methods/)
and ``strategy``, ``server-lr`` and ``averaging``, whose allowed values come from the
declarations; strategies/config.py puts them all together into ``SCHEMA``. A plug-in may
not declare any of them (``GENERAL_KEY_NAMES``): strategies/methods/registry.py refuses it.
"""

from __future__ import annotations

from clients.faults import FAULT_FORMAT, parse_faults
from clients.model_names import DEFAULT_MODEL, MODEL_NAMES
from clients.model_plugins import MODEL_PLUGINS
from clients.options import Option
from clients.options import one_of as _one_of
from clients.system_speed import STRAGGLER_POLICIES
from partitions.client_dirichlet import CONCENTRATIONS as CLIENT_CONCENTRATIONS
from partitions.client_dirichlet import EXHAUSTIONS as CLIENT_EXHAUSTIONS
from partitions.datasets import BUILTIN_DATASETS, is_known_dataset
from partitions.stats import PARTITION_SCHEMES
from strategies.participation import AVAILABILITY_SOURCES, PARTICIPATION_MODELS
from strategies.privacy import DP_ORDERS
from strategies.schedules import EXPLORATIONS, LR_SCHEDULES
from strategies.system_clock import SYSTEM_SPEEDS, parse_epochs_range
from strategies.tracking import TRACKERS, tracker_names

# participation's default (pyproject.toml's): with clients-per-round > 0 it must stay so.
DEFAULT_PARTICIPATION = 0.5
# IMA on FedAdam/FedYogi/FedAdagrad: the window of FMA aggregates is the target of the
# optimiser's step (the IMA authors' code), or the window of the optimiser's outputs is sent.
IMA_SERVER_OPT_ORDERINGS = ("fma-target", "output-window")
# Which parameters an averaging rule averages (strategies/averaging.py); the others are the newest base model's.
AVERAGING_SUBSETS = ("all", "features", "classifier")
DEVICES = ("auto", "cpu", "cuda")
# Local data augmentation: none, or random crop (padding 4) + horizontal flip (clients/augmentation.py).
AUGMENTATIONS = ("none", "crop-flip")


# Plausible bounds: far beyond any paper's setup (10,000 rounds, 20 local epochs), short of
# values that would only run until killed.
MAX_ROUNDS, MAX_LOCAL_EPOCHS, MAX_BATCH = 1_000_000, 10_000, 1_000_000

# More torch threads than any machine here has cores is a typo.
MAX_TORCH_THREADS = 1024

# Discovery waits for every client process to start and answer: less cannot succeed.
MIN_NODE_TIMEOUT_S = 10.0


def _parses_as_faults(spec: str) -> bool:
    try:
        parse_faults(spec)
    except ValueError:
        return False
    return True


def _parses_as_epochs_range(text: str) -> bool:
    try:
        bounds = parse_epochs_range(text)
    except ValueError:
        return False
    return bounds is None or 1 <= bounds[0] <= bounds[1] <= MAX_LOCAL_EPOCHS


# The keys listed before the method's (``strategy``, ``server-lr``, then each method's own).
DATA_AND_TRAINING: dict[str, Option] = {
    "dataset": Option(str, f"one of {', '.join(BUILTIN_DATASETS)} or 'hf:<hub id or local path>'", is_known_dataset),
    "data-dir": Option(str, "a directory path, or '' for the default location"),
    "model": Option(str, "'auto' (the data set's default: " + ", ".join(f"{data} {model}" for data, model in DEFAULT_MODEL.items())
                    + ", any other cifar-cnn) or one of " + ", ".join(repr(name) for name in (*MODEL_NAMES, *MODEL_PLUGINS))
                    + (f" (plug-ins: {', '.join(map(repr, MODEL_PLUGINS))})" if MODEL_PLUGINS else ""),
                    lambda v: v == "auto" or v in MODEL_NAMES or v in MODEL_PLUGINS, ("auto", *MODEL_NAMES, *MODEL_PLUGINS)),
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
    "clients-per-round": Option(int,
            "an integer >= 0 (clients sampled each round; 0 = participation · num-clients; else participation "
            f"stays at its default {DEFAULT_PARTICIPATION})", lambda v: v >= 0),
    "participation-model": Option(str,
            "'uniform' (every client available every round), 'availability' (client k available with its own "
            "probability p_k: availability-source), 'cyclic' (cyclic-groups groups available in turn, "
            "cyclic-rounds rounds each) or 'data-correlated' (p_k set by the share of its examples in the first "
            "correlated-classes classes); the cohort is sampled from the available clients",
            lambda v: v in PARTICIPATION_MODELS, PARTICIPATION_MODELS),
    "availability-min": Option(float, "a probability in (0, 1] (the least available client's p_k)",
            lambda v: 0 < v <= 1),
    "availability-max": Option(float, "a probability in (0, 1], at least availability-min (the most available "
            "client's p_k)", lambda v: 0 < v <= 1),
    "availability-source": Option(str, "'random' (p_k drawn once per client, uniform between availability-min "
            "and -max) or 'data-size' (p_k rising linearly with the client's number of examples)",
            lambda v: v in AVAILABILITY_SOURCES, AVAILABILITY_SOURCES),
    "cyclic-groups": Option(int, "an integer >= 2 (participation-model = 'cyclic': client k is in group k mod "
            "this)", lambda v: v >= 2),
    "cyclic-rounds": Option(int, "an integer >= 1 (participation-model = 'cyclic': rounds each group stays "
            "available)", lambda v: v >= 1),
    "correlated-classes": Option(int, "an integer >= 0 (participation-model = 'data-correlated': the first this "
            "many classes make a client available; 0 = the first half)", lambda v: v >= 0),
    "system-speeds": Option(str, "'none' (no simulated clock), 'lognormal' (each client's compute speed and "
            "bandwidth drawn once, speed-sigma, bandwidth-mbps, bandwidth-sigma) or 'trace' (read from the CSV "
            "file speed-trace); results.csv then has each round's simulated-seconds and the run's simulated-time",
            lambda v: v in SYSTEM_SPEEDS, SYSTEM_SPEEDS),
    "speed-sigma": Option(float, "a number >= 0 (σ of ln compute speed; the median client runs a step in "
            "step-seconds)", lambda v: v >= 0),
    "bandwidth-mbps": Option(float, "a number > 0 (the median client's bandwidth, megabits per second)",
            lambda v: v > 0),
    "bandwidth-sigma": Option(float, "a number >= 0 (σ of ln bandwidth)", lambda v: v >= 0),
    "speed-trace": Option(str, "'' or the path of a CSV file with columns speed, bandwidth-mbps (client k "
            "takes row k mod its rows)"),
    "step-seconds": Option(float, "a number > 0 (simulated seconds of one local step at speed 1)", lambda v: v > 0),
    "straggler-policy": Option(str, "'wait' (a round lasts as long as its slowest client), 'deadline' (a client "
            "that cannot finish by round-deadline is dropped) or 'partial' (it sends the local steps it finished "
            "by then)", lambda v: v in STRAGGLER_POLICIES, STRAGGLER_POLICIES),
    "round-deadline": Option(float, "a number of simulated seconds >= 0 (straggler-policy 'deadline' and "
            "'partial'; 0 = none)", lambda v: v >= 0),
    "local-epochs-range": Option(str, "'' or 'A-B' (each client draws its local epochs from A..B every round, "
            "FedNova's heterogeneous epochs; replaces local-epochs)", _parses_as_epochs_range),
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
}
# The keys listed after ``averaging``.
AVERAGING_AND_RUN: dict[str, Option] = {
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
            "a number >= 0 (server-side differential privacy, DP-FedAvg's fixed-denominator mean: clip each "
            "client's update to this L2 norm C, average over the m sampled clients, add Gaussian noise; 0 = off)",
            lambda v: v >= 0),
    "dp-noise-multiplier": Option(float,
            "a number >= 0 (σ: the noise's standard deviation is σ·C/m, m the cohort; needs dp-clipping-norm > 0)",
            lambda v: v >= 0),
    "dp-order": Option(str, "'inside' (averaging of the private base models: the noise is added to each base "
            "model) or 'outside' (the noise is added once, to what the averaging rule returns)",
            lambda v: v in DP_ORDERS, DP_ORDERS),
    "dp-delta": Option(float, "a number in (0, 1) (the δ at which results.csv's dp-epsilon is reported)",
            lambda v: 0 < v < 1),
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
            "a fraction in [0, 0.5] (0 = off; else each client scores the received model every round on this "
            "fraction of its examples, held out of its partition or a test slice (client-evaluation-split): "
            "results.csv's client-accuracy-mean, -worst-10pct and -std across the cohort)", lambda v: 0 <= v <= 0.5),
    "evaluation": Option(str,
            "'central' (the server scores each round's model on the run's test split) or 'federated' (it holds no "
            "data: the round's sampled nodes score it on their own test splits, and results.csv has the "
            "example-weighted mean of their replies; needs client-evaluation > 0)",
            lambda v: v in ("central", "federated")),
    "client-evaluation-split": Option(str,
            "'hold-out' (each client holds out client-evaluation of its partition and trains on the rest) or "
            "'test-slice' (it trains on all of it and is scored on a slice of the test split of client-evaluation "
            "times its examples, drawn with its label proportions: a paper's setup, unchanged)",
            lambda v: v in ("hold-out", "test-slice")),
    "resume": Option(bool, "true or false (continue from output-dir/checkpoint.pt when there is one)"),
    "fault-injection": Option(str, f"'' or {FAULT_FORMAT}", _parses_as_faults),
    "track": Option(str,
            f"'' or a comma-separated list of {', '.join(TRACKERS)} (log the config, every round and the summary "
            f"to these experiment trackers; the optional extra 'tracking')",
            lambda v: all(name in TRACKERS for name in tracker_names(v))),
    "track-dir": Option(str, "a directory path, or '' for output-dir (where TensorBoard, MLflow and W&B write)"),
    "track-group": Option(str, "a name, or '' for output-dir's name (the MLflow experiment, the W&B group)"),
}
# Every general key, with the three whose values the declarations give.
GENERAL_KEY_NAMES = frozenset({*DATA_AND_TRAINING, "strategy", "server-lr", "averaging", *AVERAGING_AND_RUN})
