"""Ray's head started without the dashboard's API server and the autoscaler's monitor."""

from __future__ import annotations

import importlib
from typing import Any

from clients.flower_internals.releases import RAY_NODE_MODULE, replaced, speed_up_available


def init_ray(**init_args: Any) -> None:
    """``ray.init(**init_args)``. Where that starts a Ray head here with
    ``include_dashboard=False`` (no address, no ``RAY_ADDRESS``) on Ray 2.55.1, the head
    starts without two of its processes, which nothing Flower or Basin runs reads:
    - the dashboard's API server: ``Node.start_api_server`` leaves the empty dashboard URL
      that ``include_dashboard=False`` gives, and starts and waits for nothing (~1–2 s of
      each Ray start on 2 cores);
    - the autoscaler's monitor (``Node.start_monitor``, what ``ray start --no-monitor``
      leaves out): it would scale a cluster of nodes Ray launches, and a head started here
      is one machine's; ~0.5 CPU-seconds of each Ray start, 0.4 s of a small run's wall
      time on 2 cores."""
    import os

    import ray

    starts_head = "address" not in init_args and not os.environ.get("RAY_ADDRESS")
    if not starts_head or init_args.get("include_dashboard") is not False or not speed_up_available("Ray head"):
        ray.init(**init_args)
        return
    node_class = importlib.import_module(RAY_NODE_MODULE).Node
    for method, replacement in HEAD_WITHOUT.items():
        replaced[f"{RAY_NODE_MODULE}:Node.{method}"] = getattr(node_class, method)
        setattr(node_class, method, replacement)
    try:
        ray.init(**init_args)
    finally:
        for method in HEAD_WITHOUT:
            setattr(node_class, method, replaced.pop(f"{RAY_NODE_MODULE}:Node.{method}"))


def _no_api_server(node: Any, *, include_dashboard: bool | None, raise_on_failure: bool) -> None:
    node._webui_url = ""


def _no_monitor(node: Any) -> None:
    pass


# What init_ray's Ray head starts without: Node's method → what runs instead.
HEAD_WITHOUT = {"start_api_server": _no_api_server, "start_monitor": _no_monitor}
