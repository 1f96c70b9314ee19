"""Messages built outside a ServerApp, stamped with a sender's ids (experiments.costs)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def task_identity(run_id: int, node_id: int, task_id: int) -> Iterator[None]:
    """Messages built inside are stamped with these ids, as inside a ServerApp; restored after."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, node_id, task_id
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved
