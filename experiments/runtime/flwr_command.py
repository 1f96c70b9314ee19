"""``python -m experiments.runtime.flwr_command run ARGS``: Flower's ``flwr run ARGS``, with
its local SuperLink started before Flower's command line has loaded.

``flwr run`` on a local federation loads Flower's command line (1.8 s on 2 CPU cores), finds
no SuperLink answering, starts one and waits for it to answer: ~3.3 s more, as the SuperLink
loads Flower too. This starts that same SuperLink, with the command line and environment
``flwr run`` would give it (``clients.flower_internals.local_superlink``), first, then loads
Flower's command line while the SuperLink loads, waits until it answers, and runs ``flwr``:
Flower's ``ensure_local_superlink`` finds a SuperLink answering on its port and starts none,
as with any local SuperLink already running. The processes are Flower's, in the same tree
and session as ``flwr run`` makes them; only their start overlaps.

Where the installed Flower is not the one ``local_superlink`` was read from, or the SuperLink
does not answer within the 15 s ``flwr run`` gives its own, it is stopped and ``flwr run``
starts its own as it always does; where FLWR_HOME is not set or the command is not ``run``,
this is plain ``flwr``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

from clients import flower_internals

# As long as `flwr run` waits for the SuperLink it starts itself, then the same probe.
SUPERLINK_STARTUP_TIMEOUT_S = 15.0
PROBE_TIMEOUT_S, PROBE_INTERVAL_S = 0.4, 0.05


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
    if argv[:1] == ["run"] and "FLWR_HOME" in os.environ:
        superlink = start_local_superlink(os.environ)
    from flwr.cli.app import app  # loads while the SuperLink does

    if superlink is not None and not (flower_internals.speed_up_available("local SuperLink")
                                      and wait_until_answering(superlink, flower_internals.local_superlink_port(os.environ))):
        # Flower's command line starts its own: never two SuperLinks on one port and database.
        from experiments.runtime.processes import stop_process_tree

        stop_process_tree([superlink.pid], grace=0.0)
        superlink.wait()
    sys.argv = ["flwr", *argv]
    return app()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
