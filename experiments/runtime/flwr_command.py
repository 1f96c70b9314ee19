"""``.venv/bin/python -m experiments.runtime.flwr_command run ARGS``: Flower's ``flwr run ARGS``, with
its local SuperLink started before Flower's command line has loaded.

``flwr run`` on a local federation loads Flower's command line, finds no SuperLink
answering, starts one and waits while it loads Flower too and creates its SQLite database
(seconds each: docs/speed.md, "Start-up, stage by stage"). Here:

- the run's Flower configuration (``FLWR_HOME/config.toml``, where ``flwr`` would write its
  default) names the local SuperLink ``:local-in-memory:``, Flower's setting for a local
  SuperLink that keeps its state in memory: a run's SuperLink serves that run only;
- that SuperLink is started first, with the command line and environment ``flwr run``
  would give it (``clients.flower_internals.local_superlink``), then Flower's command line
  loads while it does; once it answers, ``flwr`` runs and its ``ensure_local_superlink``
  finds it and starts none, as with any local SuperLink already running.

The processes are Flower's, in the same tree and sessions as ``flwr run`` makes them; only
their start overlaps.

Where the installed Flower is not the one ``local_superlink`` was read from, or the SuperLink
does not answer within the 15 s ``flwr run`` gives its own, it is stopped and ``flwr run``
starts its own as it always does, unless another SuperLink answers on the run's port (this
one could not take it): then the command fails instead of joining that SuperLink. Where
FLWR_HOME is not set, the command is not ``run``, or the speed-ups are off
(``flower_internals.speed_ups_off_because``: checked before Flower loads), this is plain ``flwr``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from clients import flower_internals

# A Flower configuration whose local SuperLink keeps its state in memory (flwr's default
# configuration names ":local:", which keeps it in FLWR_HOME/local-superlink/state.db).
FLOWER_CONFIG = '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local-in-memory:"\n'
# As long as `flwr run` waits for the SuperLink it starts itself, then the same probe.
SUPERLINK_STARTUP_TIMEOUT_S = 15.0
PROBE_TIMEOUT_S, PROBE_INTERVAL_S = 0.4, 0.05


def write_flower_config(flwr_home: Path) -> None:
    """Write :data:`FLOWER_CONFIG` as ``flwr_home``'s Flower configuration, unless it has one."""
    config = flwr_home / "config.toml"
    if not config.exists():
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(FLOWER_CONFIG)


def start_local_superlink(environ: Mapping[str, str]) -> subprocess.Popen:
    """Start the SuperLink ``flwr run`` would start in ``environ``, in a session of its own
    as Flower starts it; announced with Flower's own line (start-up progress reads it)."""
    command, env = flower_internals.local_superlink(environ)
    print(f"Starting local SuperLink on 127.0.0.1:{flower_internals.local_superlink_port(environ)}...", flush=True)
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def answering(port: str) -> bool:
    """Whether a SuperLink answers on HTTP port ``port``: the health check ``flwr run`` makes."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=PROBE_TIMEOUT_S) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError):
        return False


def wait_until_answering(superlink: subprocess.Popen, port: str, timeout: float = SUPERLINK_STARTUP_TIMEOUT_S) -> bool:
    """Wait until the SuperLink answers on ``port`` (True), has exited or ``timeout`` passed
    (False)."""
    deadline = time.monotonic() + timeout
    while superlink.poll() is None and time.monotonic() < deadline:
        if answering(port):
            return True
        time.sleep(PROBE_INTERVAL_S)
    return False


def main(argv: list[str]) -> int:
    superlink = None
    if argv[:1] == ["run"] and "FLWR_HOME" in os.environ and not flower_internals.speed_ups_off_because():
        write_flower_config(Path(os.environ["FLWR_HOME"]))
        superlink = start_local_superlink(os.environ)
    from flwr.cli.app import app  # loads while the SuperLink does

    if superlink is not None and not (flower_internals.speed_up_available("local SuperLink")
                                      and wait_until_answering(superlink, flower_internals.local_superlink_port(os.environ))):
        # Flower's command line starts its own: never two SuperLinks on one port and database.
        from experiments.runtime.processes import stop_process_tree

        stop_process_tree([superlink.pid], grace=0.0)
        superlink.wait()
        port = flower_internals.local_superlink_port(os.environ)
        if answering(port):  # not this run's: Flower's command line would join it, and its end would end this run
            print(f"error: another SuperLink answers on 127.0.0.1:{port}, the port chosen for this run's own; "
                  "start the run again (it chooses free ports)", file=sys.stderr, flush=True)
            return 1
    sys.argv = ["flwr", *argv]
    return app()


def command_line() -> int:
    """:func:`main` with this process's command line: what the run's own ``flwr`` runs
    (experiments/runtime/warm_processes.py), in a process of its own or in one forked from a
    fork server. Flower's command-line modules read the run's ports from the environment as
    they are imported (``flwr.cli.constant``), and the server imported some of them (its
    SuperLink's side does) with its own environment, which for a job's server has none of a
    run's: they are imported afresh here, with the run's (0.1 CPU-seconds after the server's
    imports)."""
    for name in [name for name in sys.modules if name.startswith("flwr.cli.") or name == "flwr.cli"]:
        del sys.modules[name]
    return main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
