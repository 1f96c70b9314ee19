"""Names of the records and config entries exchanged between Basin's server and clients.

Server strategies add their client-side settings to the round's ``config`` record (the
way Flower's FedProx sends ``proximal-mu``); methods that exchange tensors besides the
model add named ArrayRecords to the message. Both sides import these names from here, and
the client side which partition its node holds (:func:`partition_of`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flwr.app import Context, Message

# Round config entries (ConfigRecord "config").
OBJECTIVE = "objective"  # name of the local objective (clients/objectives/); absent = cross-entropy
FEDDYN_ALPHA = "feddyn-alpha"  # FedDyn's α
FEDCM_ALPHA = "fedcm-alpha"  # FedCM's α: the weight of the local gradient in v = α·g + (1 − α)·Δ_t
MIME_MOMENTUM = "mime-momentum"  # β of the server's base optimizer (0: plain SGD)
MIME_DAMPENED = "mime-dampened"  # true: d = (1 − β)·g̃ + β·m instead of β·m + g̃
FEDFA_ANCHOR_LOSS = "fedfa-anchor-loss"  # this round: add FedFA's anchor loss (false: plain CE, IMA's round 1)
FEDFA_CALIBRATE = "fedfa-calibrate"  # this round: calibrate the classifier on the anchors after each step
ADABEST_MU = "adabest-mu"  # AdaBest's μ
ADABEST_OFFICIAL_CODE = "adabest-official-code"  # true: varnio/fedsim's μ_ad form
ADABEST_MEAN_EXAMPLES_PER_STEP = "adabest-mean-examples-per-step"  # the server's running mean of n_j/K_j (μ_ad)
FEDCM_SCALE = "fedcm-scale"  # "client": Δ_t = D/(η_l·K_i) on the client; "none": D is already Δ_t
STEP_LR_START = "step-lr-start"  # in-round lr factor at the first local step (FedSWA: 1; official code: 2)
STEP_LR_END = "step-lr-end"  # in-round lr factor reached after the last step (FedSWA: ρ; official code: 0)
AUGMENT_PAD = "augment-pad"  # per channel, the standardised black pixel that crop padding adds
CONTROL_AFTER_CLIP = "control-after-clip"  # add control-variate corrections after gradient clipping (FedMoSWA's code)
CUDA_GRAPHS = "cuda-graphs"  # on CUDA, replay the local step as a CUDA graph where it can be (clients/client_step.py)
LOCAL_STEPS = "local-steps"  # train this many local steps instead of local-epochs epochs (0 = epochs)
# Option-II control updates divide by lr × this many steps instead of Σ_k η_k (FedMoSWA's
# official code divides by 50 whatever the number of steps it ran; 0 = Σ_k η_k).
CONTROL_STEP_COUNT = "control-step-count"
# The server's method declares LABEL_COUNTS_RECORD among its reply_records: each reply carries the client's label counts.
REPORT_LABEL_COUNTS = "report-label-counts"
# Stateful methods with checkpoints on (clients/state_store.py); absent: no snapshots.
CLIENT_STATE_ROOT = "client-state-root"  # the server's output-dir/client-state
CLIENT_STATE_RUN = "client-state-run"  # the token naming this run's snapshots (kept in the checkpoint)
CHECKPOINT_EVERY = "checkpoint-every"  # the server checkpoints every this many rounds
RESUMED_AFTER_ROUND = "resumed-after-round"  # the checkpoint's round this run resumed after (0: fresh run)
CLIENT_STATE_ATTEMPT = "client-state-attempt"  # a token per start of the ServerApp (fresh or resumed)
# To one node: the last round its reply was accepted in; a node whose memory and snapshots
# hold no state of that round or later has lost its client state (clients/client_work.py).
CLIENT_STATE_TRAINED_ROUND = "client-state-trained-round"
CLIENT_STATE_LOST = "ClientStateLost"  # the error a node that lost its client state replies with
# The simulated clock (strategies/system_clock.py, clients/system_speed.py): to one node, its
# compute speed (1 = a step takes step-seconds) and bandwidth (bytes per simulated second);
# to all, a step's simulated seconds at speed 1, the straggler policy and the round's deadline
# in simulated seconds (0: none).
CLIENT_SPEED = "client-speed"
CLIENT_BANDWIDTH = "client-bandwidth"
STEP_SECONDS = "step-seconds"
STRAGGLER_POLICY = "straggler-policy"
ROUND_DEADLINE = "round-deadline"
STEP_BUDGET = "step-budget"  # set by the client itself under partial work: the steps it has time for

# Client state (context.state) entries.
# Node config entry: where this SuperNode keeps its state snapshots instead of CLIENT_STATE_ROOT.
NODE_CLIENT_STATE_DIR = "client-state-dir"
SCAFFOLD_CLIENT_CONTROL = "scaffold-client-control"  # c_i
MOSWA_CLIENT_CONTROL = "moswa-client-control"  # c_i
FEDDYN_CLIENT_GRADIENT = "feddyn-client-gradient"  # ∇L_k(θ_k^{t−1}), FedDyn's linear term
MOON_PREVIOUS_MODEL = "moon-previous-model"  # the client's model after its last round
ADABEST_CLIENT_BIAS = "adabest-client-bias"  # h_i
ADABEST_LAST_ROUND = "adabest-last-round"  # t_i′: the last round the client trained in
FEDLESAM_PREVIOUS_GLOBAL = "fedlesam-previous-global"  # θ^{τ_i}: the global model of the client's last round

# Message actions besides the default ones ("query.<action>").
FULL_GRADIENT_ACTION = "full_gradient"  # reply with ∇f_i(θ) over all of the client's examples (MIME)

# Reply metrics (MetricRecord "metrics").
SOLVER_A_NORM = "fednova-a-norm"  # ‖a_i‖₁ of the client's local solver (FedNova normalises by it)
TRAIN_START = "train-start"  # wall clock (s since the epoch) when the client began the round's work
TRAIN_END = "train-end"  # … and when it finished, before its reply is serialised
HELD_OUT_ACCURACY = "held-out-accuracy"  # client-evaluation > 0: the received model's accuracy on its held-out part
HELD_OUT_LOSS = "held-out-loss"  # … its mean cross-entropy there
HELD_OUT_EXAMPLES = "held-out-examples"  # … and how many examples that part holds
# evaluation = federated: an evaluate reply's metrics, the examples of the node's test split
# and, per model the message carried (base, averaged), "<model>-accuracy" and "<model>-loss"
EVALUATED_EXAMPLES = "examples"
# ArrayRecords of an evaluate message (evaluation = federated): the round's models.
EVALUATED_BASE_MODEL, EVALUATED_AVERAGED_MODEL = "base", "averaged"
CHANNELS_LAST = "channels-last"  # 1.0 where the client trained in channels-last (clients/memory_format.py), else 0.0
GPU_PEAK_MIB = "gpu-peak-mib"  # the client process's peak CUDA memory allocated so far (MiB; CUDA only)
# With the simulated clock: the client's simulated seconds for the round (its steps and its
# message's bytes both ways), the steps it planned (more than local-steps: partial work), and
# LATE = 1 in the reply of a client that missed the deadline and did no work.
SIMULATED_SECONDS = "simulated-seconds"
PLANNED_STEPS = "planned-steps"
LATE = "late"

# ArrayRecords.
MODEL_RECORD = "arrays"  # both ways: the model (the ArrayRecord key of Flower's strategies)
SCAFFOLD_SERVER_CONTROL = "scaffold-control"  # server → client: c
SCAFFOLD_DELTA_CONTROL = "scaffold-delta-control"  # client → server: Δc_i
MOSWA_SERVER_CONTROL = "moswa-control"  # server → client: m
MOSWA_DELTA_CONTROL = "moswa-delta-control"  # client → server: Δc_i = c_i⁺ − m (Algorithm 1 line 14)
MOSWA_NEW_CONTROL = "moswa-new-control"  # client → server: c_i⁺ (official-code variant's EMA)
FEDFA_ANCHORS = "fedfa-anchors"  # server → client: A, one feature anchor per class (C × d)
LABEL_COUNTS_RECORD = "label-counts"  # client → server: {"counts": per class, its training split's examples}
OBJECTIVE_RECORD = "objective-record"  # client → server: what the local objective sends back (FedFA: its anchors)
MIME_STATE = "mime-state"  # server → client: m, the server optimizer's momentum (frozen on the client)
FULL_GRADIENT_RECORD = "gradient"  # client → server: ∇f_i(θ) over all of its examples (MIME's extra exchange)
MIME_CORRECTION = "mime-correction"  # server → client: c, the cohort's mean full-batch gradient at θ (MIME)
FEDLESAM_UPDATE = "fedlesam-update"  # server → client: u, the last global update (official-code variant)
FEDCM_DIRECTION = "fedcm-direction"  # server → client: D, the cohort's mean θ − y_i of the last round


# Node config: the path of the node's own data on its machine (partitions/node_data.py); a
# node without it trains on its partition of the run's data set.
NODE_DATA_PATH = "data-path"
# Node config: the node's name, its identity in a federation whose nodes have no partition id
# (strategies/discovery.py ranks the names; each message then carries the node's rank).
NODE_NAME = "node-name"
# Message config entries, to a named node: the partition id and count the server gave it.
ASSIGNED_PARTITION = "assigned-partition-id"
ASSIGNED_PARTITIONS = "assigned-num-partitions"


def adopt_assignment(msg: Message, context: Context) -> None:
    """A named node (node config ``node-name``, no partition id) takes the partition id the
    server gave it from the message, for this message's work."""
    config = msg.content.config_records.get("config")
    if config is not None and ASSIGNED_PARTITION in config:
        context.node_config["partition-id"] = int(config[ASSIGNED_PARTITION])
        context.node_config["num-partitions"] = int(config[ASSIGNED_PARTITIONS])


def partition_of(context: Context) -> tuple[int, int]:
    """(partition id, number of partitions) of this node: its node config's (for a named node,
    the one its message assigned: :func:`adopt_assignment`), or, for a node whose own data
    experiments.write_partitions wrote, what that folder's basin-node.json says."""
    config = context.node_config
    if "partition-id" not in config and NODE_DATA_PATH in config:
        from partitions.node_data import node_description

        described = node_description(str(config[NODE_DATA_PATH]))
        return int(described["partition-id"]), int(described["num-partitions"])
    return int(config["partition-id"]), int(config["num-partitions"])
