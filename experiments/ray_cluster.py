"""Run a Basin simulation's clients on an existing Ray cluster.

Flower's simulation engine calls ``ray.init()`` without an address, and Ray then joins
the cluster named by ``RAY_ADDRESS``; the launcher sets that variable for ``flwr run``,
which passes it on to the SuperLink and the simulation process it starts. Flower 1.41's
local federation sets no ``init-args`` (``num-cpus``/``num-gpus``, which Ray refuses when
joining a cluster), so nothing else changes. If nothing answers at the address, Ray would
only fail inside the simulation, after Flower started, with the reason buried in
``flwr.log``: :func:`check_ray_address` fails first, with a clear error.

The simulation process is a Ray driver, and Ray connects a driver through a raylet on its
own machine: launch from a node of the cluster (e.g. the head), or Ray fails after about
60 s ("No node info found matching attributes") and the run fails.
"""

from __future__ import annotations

import socket


class RayClusterUnreachable(ConnectionError):
    """No Ray cluster answers at the given address."""


def check_ray_address(address: str, timeout: float = 3.0) -> None:
    """Raise RayClusterUnreachable unless something accepts connections at ``address``.

    ``address`` is the cluster's GCS address ``HOST:PORT``, as printed by
    ``ray start --head`` (``ray://`` Ray Client addresses are not supported). A TCP
    connection is the cheap check (milliseconds; ``ray.init`` would take seconds and
    start Ray in this process); it does not prove that the listener is Ray's GCS.
    """
    host, sep, port = address.rpartition(":")
    if address.startswith("ray://") or not sep or not host or not port.isdigit():
        raise RayClusterUnreachable(
            f"Ray address {address!r} is not allowed; allowed: the GCS address HOST:PORT "
            "that `ray start --head` prints, e.g. 10.0.0.5:6379"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as error:
        raise RayClusterUnreachable(
            f"no Ray cluster answers at {address} ({error}); start one with "
            f"`ray start --head --port {port}` on {host}, or check the address"
        ) from None
