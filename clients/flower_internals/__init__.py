"""Every use Basin makes of Flower's (and Ray's) private surface, in this package, checked
against the releases it was read from (flwr 1.41.0 and 1.42.0; Ray 2.55.1, which both pin).
Basin builds on Flower's public API freely; anything beyond it is named here and nowhere
else (``tests/test_flower_internals.py`` fails on a private name used outside this package).

A module per job, their names re-exported here:
- ``releases``: the checked releases, the hash of each private function's source
  (:data:`SOURCE_SHA256`), whether each speed-up may run (:func:`speed_up_available`; on a
  release not checked, or with ``BASIN_SPEEDUPS=off``, none, decided before anything
  private is imported: :func:`speed_ups_off_because`). Nothing refuses to run;
- speed-ups, each with Flower's own code as the fallback: ``engine`` (the simulation
  engine's replacements, clients/simulation_engine.py), ``ray_head`` (Ray's head without the
  dashboard's API server and the autoscaler's monitor), ``superlink`` (the local SuperLink
  started ahead of ``flwr run``), ``supernode`` (a SuperNode's waits capped);
- ``replies``: a fix, a deployment's replies pulled within the round's deadline;
- ``aggregation``: the in-place FedAvg mean's reply checks and DP's clipping and noise
  (strategies/weighted_mean.py, strategies/privacy.py), ``SType.NUMPY``, and the attributes
  in which FedAvgM and FedOpt keep their state (checkpoints);
- ``messages``: ``TaskIdentity``, for messages built outside a ServerApp (experiments/costs.py).

What each speed-up does and saves: docs/speed.md.
"""

from __future__ import annotations

from clients.flower_internals.aggregation import (
    STRATEGY_STATE_ATTRIBUTES,
    add_aggregate_noise,
    check_and_log_replies,
    error_in_place_of,
    numpy_stype,
    strategy_state,
)
from clients.flower_internals.engine import (
    add_online_nodes,
    engine_function,
    engine_module,
    load_engine,
    partition_keys,
    replace_client_actor,
    replace_engine_functions,
    replace_ray_init,
    run_info_store_classes,
    undelivered_destinations,
)
from clients.flower_internals.messages import (
    task_identity,
)
from clients.flower_internals.ray_head import (
    HEAD_WITHOUT,
    init_ray,
)
from clients.flower_internals.releases import (
    ENGINE_MODULE,
    FLOWER_RELEASES,
    HTTP_GRID_MODULE,
    LINK_STATE_MODULE,
    LOCAL_SUPERLINK_MODULE,
    PRIVATE_NAMES,
    RAY_ACTOR_MODULE,
    RAY_BACKEND_MODULE,
    RAY_NODE_MODULE,
    RAY_VERSION,
    RUN_INFO_STORE_MODULE,
    SOURCE_SHA256,
    SPEED_UPS,
    SPEED_UPS_SWITCH,
    SUPERNODE_MODULE,
    checked_releases,
    installed_flower,
    installed_release,
    mismatch,
    original,
    replaced,
    resolve,
    source_hash,
    speed_up_available,
    speed_ups_off_because,
)
from clients.flower_internals.replies import (
    REPLY_PULL_BACKOFF_CAP_S,
    REPLY_PULL_BACKOFF_S,
    bounded_reply_pulls_available,
    pull_replies,
)
from clients.flower_internals.superlink import (
    LOCAL_CONTROL_PORT,
    LOCAL_CONTROL_PORT_VARIABLE,
    LOCAL_SUPERLINK_HTTP_PORT,
    LOCAL_SUPERLINK_HTTP_PORT_VARIABLE,
    local_superlink,
    local_superlink_port,
)
from clients.flower_internals.supernode import (
    cap_supernode_waits,
)

__all__ = [
    "ENGINE_MODULE",
    "FLOWER_RELEASES",
    "HEAD_WITHOUT",
    "HTTP_GRID_MODULE",
    "LINK_STATE_MODULE",
    "LOCAL_CONTROL_PORT",
    "LOCAL_CONTROL_PORT_VARIABLE",
    "LOCAL_SUPERLINK_HTTP_PORT",
    "LOCAL_SUPERLINK_HTTP_PORT_VARIABLE",
    "LOCAL_SUPERLINK_MODULE",
    "PRIVATE_NAMES",
    "RAY_ACTOR_MODULE",
    "RAY_BACKEND_MODULE",
    "RAY_NODE_MODULE",
    "RAY_VERSION",
    "REPLY_PULL_BACKOFF_CAP_S",
    "REPLY_PULL_BACKOFF_S",
    "RUN_INFO_STORE_MODULE",
    "SOURCE_SHA256",
    "SPEED_UPS",
    "SPEED_UPS_SWITCH",
    "STRATEGY_STATE_ATTRIBUTES",
    "SUPERNODE_MODULE",
    "add_aggregate_noise",
    "add_online_nodes",
    "bounded_reply_pulls_available",
    "cap_supernode_waits",
    "check_and_log_replies",
    "checked_releases",
    "engine_function",
    "engine_module",
    "error_in_place_of",
    "init_ray",
    "installed_flower",
    "installed_release",
    "load_engine",
    "local_superlink",
    "local_superlink_port",
    "mismatch",
    "numpy_stype",
    "original",
    "partition_keys",
    "pull_replies",
    "replace_client_actor",
    "replace_engine_functions",
    "replace_ray_init",
    "replaced",
    "resolve",
    "run_info_store_classes",
    "source_hash",
    "speed_up_available",
    "speed_ups_off_because",
    "strategy_state",
    "task_identity",
    "undelivered_destinations",
]
