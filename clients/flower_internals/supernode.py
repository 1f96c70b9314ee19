"""A SuperNode's waits capped (experiments/runtime/supernode_command.py)."""

from __future__ import annotations

import importlib
import time
from typing import Any

from clients.flower_internals.releases import SUPERNODE_MODULE, replaced, speed_up_available


class _CappedSleeps:
    """The ``time`` module as Flower's SuperNode loop sees it, each ``sleep`` at most ``seconds``."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self.seconds))


def cap_supernode_waits(seconds: float) -> bool:
    """In a process about to run Flower's ``flower-supernode``: make each of the SuperNode's
    waits at most ``seconds``; True where the speed-up is in place. flwr 1.41.0 and 1.42.0's
    ``start_client_internal`` sleeps 3 s whenever it asked the SuperLink for a message and
    none was there, and ``_push_messages`` 0.5 s at a time until the ClientApp's reply is
    there, so each round of a federation on one machine waited seconds for its nodes to
    notice it (their module's only use of ``time``)."""
    if not speed_up_available("SuperNode polling"):
        return False
    module = importlib.import_module(SUPERNODE_MODULE)
    if not isinstance(module.time, _CappedSleeps):
        replaced.setdefault(f"{SUPERNODE_MODULE}:time", module.time)
    module.time = _CappedSleeps(seconds)
    return True
