"""The local SuperLink that ``flwr run`` starts: its command line, environment and port
(experiments/runtime/flwr_command.py starts it first)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

# What `flwr run` calls its local SuperLink's settings: environment variables, then its defaults.
LOCAL_SUPERLINK_HTTP_PORT_VARIABLE, LOCAL_SUPERLINK_HTTP_PORT = "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "39091"
LOCAL_CONTROL_PORT_VARIABLE, LOCAL_CONTROL_PORT = "FLWR_LOCAL_CONTROL_API_PORT", "39093"


def local_superlink(environ: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment with which ``flwr run``, run in ``environ`` (which
    sets FLWR_HOME), starts its local SuperLink when none answers and its connection is
    ``:local-in-memory:``: flwr 1.41.0 and 1.42.0's ``_start_local_superlink(in_memory=True)``
    (simulation mode, subprocess isolation, state in memory, its log under
    ``FLWR_HOME/local-superlink``, the folder made here as there)."""
    runtime_dir = Path(environ["FLWR_HOME"]) / "local-superlink"
    runtime_dir.mkdir(parents=True, exist_ok=True)
    command = [
        "flower-superlink", "--insecure", "--simulation", "--isolation", "subprocess",
        "--control-api-address", f"127.0.0.1:{environ.get(LOCAL_CONTROL_PORT_VARIABLE, LOCAL_CONTROL_PORT)}",
        "--host", "127.0.0.1", "--port", local_superlink_port(environ),
        "--log-file", str(runtime_dir / "superlink.log"),
        "--log-rotation-interval-hours", "24", "--log-rotation-backup-count", "7",
    ]
    # `flwr` checks for a newer Flower itself, and so turns the SuperLink's check off.
    return command, {**environ, "FLWR_DISABLE_UPDATE_CHECK": "1"}


def local_superlink_port(environ: Mapping[str, str]) -> str:
    """The HTTP port on which ``flwr run``, run in ``environ``, looks for its local SuperLink."""
    return environ.get(LOCAL_SUPERLINK_HTTP_PORT_VARIABLE, LOCAL_SUPERLINK_HTTP_PORT)
