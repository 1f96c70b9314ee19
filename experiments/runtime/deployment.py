"""The local Deployment Engine: a SuperLink, SuperNodes and a run on them, for
``.venv/bin/python -m experiments.deploy`` (experiments/deploy.py, which imports this module,
with torch and Flower, once its arguments are parsed) and the tests.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from clients import warm_clientapp
from clients.flower_internals import speed_ups_off_because
from clients.protocol import NODE_CLIENT_STATE_DIR, NODE_DATA_PATH
from experiments.certificates import KeyPair, TlsFiles, write_supernode_key_pair, write_tls_certificates
from experiments.runtime.flower_log import follow_run, read_summary
from experiments.runtime.launch import TASK_POLL_SECONDS, TASK_POLL_VARIABLE, stage_app
from experiments.runtime.output_dir import OutputLock, create_output_dir, record_holder
from experiments.runtime.processes import (
    Guardian,
    deferred_interrupts,
    free_port,
    processes_of_home,
    stop_process_tree,
)
from experiments.runtime.run_config import APP_DIR
from experiments.runtime.run_endings import check_folder_reuse, end_summary, interrupted_reason, run_failure
from partitions.node_data import NODE_FOLDER
from strategies.checkpoint import read_checkpoint
from strategies.config import validate_run_config

FEDERATION = "basin-local"
HOST = "127.0.0.1"
STARTUP_TIMEOUT = 60.0  # seconds for the SuperLink to listen and each SuperNode to join
NODE_ID_LINE = re.compile(r"SuperNode ID: (\d+)")


class DeploymentError(RuntimeError):
    """A SuperLink or SuperNode did not start, or a ``flwr`` CLI command failed."""


@dataclass(frozen=True)
class Security:
    """How the federation is secured: plain HTTP, TLS, or TLS with SuperNode authentication."""

    tls: bool = False
    auth: bool = False

    def __post_init__(self) -> None:
        if self.auth and not self.tls:
            raise ValueError("SuperNode authentication needs TLS (Flower refuses --enable-supernode-auth without it)")

    @property
    def name(self) -> str:
        """insecure, tls or tls+auth."""
        return "tls+auth" if self.auth else "tls" if self.tls else "insecure"


@dataclass
class SuperNode:
    """One started ``flower-supernode`` process and the partition it holds."""

    partition_id: int
    process: subprocess.Popen
    log: Path
    key: KeyPair | None = None

    @property
    def node_id(self) -> int | None:
        """The id the SuperLink gave this node, once it has joined (read from its log)."""
        match = NODE_ID_LINE.search(_read(self.log))
        return int(match.group(1)) if match else None


class LocalFederation:
    """A SuperLink and SuperNodes on localhost, and a ``flwr`` CLI configured for them.

    Use as a context manager: entering starts the SuperLink and writes the federation
    entry; :meth:`start_supernodes` adds nodes; :meth:`run` submits a run; leaving stops
    every process this object started, even after an error.

    ``cpus_per_client``: CPU threads of each SuperNode's ClientApp, as ``--cpus-per-client``
    gives a simulated client (see :meth:`_supernode_env`).
    """

    def __init__(self, log_dir: Path, security: Security = Security(), cpus_per_client: float = 1.0,
                 name: str = FEDERATION):
        self.log_dir = Path(log_dir).resolve()
        self.security = security
        self.cpus_per_client = cpus_per_client
        self.name = name
        self.port = 0
        self.supernodes: list[SuperNode] = []
        self.tls: TlsFiles | None = None
        self._bin_dir = Path(sys.executable).parent
        self._processes: list[subprocess.Popen] = []
        self._temp: tempfile.TemporaryDirectory | None = None
        self._guardian: Guardian | None = None
        self._clientapp_command: Path | None = None

    def __enter__(self) -> LocalFederation:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._temp = tempfile.TemporaryDirectory(prefix="basin-deploy-")
        self.work_dir = Path(self._temp.name)
        # Every process of the federation has its FLWR_HOME under work_dir: the guardian
        # stops them all if this launcher dies (experiments/runtime/processes.py).
        self._guardian = Guardian(self.work_dir, self.log_dir)
        try:
            # Basin's `flwr-clientapp` for the SuperNodes, None with the speed-ups off.
            self._clientapp_command = None if speed_ups_off_because() else warm_clientapp.write_command(
                self.work_dir / "bin", APP_DIR)
            if self.security.tls:
                self.tls = write_tls_certificates(self.work_dir / "tls")
            self.superlink = self._start_superlink()
            self._write_cli_config()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- processes ---------------------------------------------------------------

    def _home(self, name: str) -> Path:
        """A process's own FLWR_HOME, where it installs the app, as on separate machines
        (SuperNodes sharing one can race: flwr creates the app's directory before copying
        the app into it, and a second installer takes the empty directory as installed)."""
        home = self.work_dir / "homes" / name
        home.mkdir(parents=True, exist_ok=True)
        return home

    def _env(self, home: str) -> dict[str, str]:
        """The environment of a Flower process: its own FLWR_HOME and this venv's commands first."""
        path = f"{self._bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        # A SuperExec (the SuperLink's, for the ServerApp; each SuperNode's, for every
        # message's ClientApp) looks for its next task every 0.2 s instead of 1 s.
        return {**os.environ, "PATH": path, "FLWR_HOME": str(self._home(home)),
                TASK_POLL_VARIABLE: os.environ.get(TASK_POLL_VARIABLE, TASK_POLL_SECONDS)}

    def _supernode_env(self, home: str) -> dict[str, str]:
        """A SuperNode's environment: CPU threads per ClientApp as Ray gives a simulated client.

        Ray runs each simulated client with ``OMP_NUM_THREADS`` = its whole CPUs (at least
        1) unless the variable is already set; torch sizes its thread pool from it. CPU
        kernels sum in an order that depends on the thread count, so without this a
        SuperNode's ClientApp (all cores by default) would train to slightly different
        weights than the same client in simulation. It also keeps N SuperNodes on one
        machine from oversubscribing its cores.
        """
        return {"OMP_NUM_THREADS": str(max(1, math.floor(self.cpus_per_client))), **self._env(home)}

    def _spawn(self, command: list[str], env: dict[str, str], log: Path, cwd: Path | None = None,
               mode: str = "w") -> subprocess.Popen:
        # Own session: a terminal's Ctrl-C reaches only this script, whose cleanup then
        # stops each process with everything it started (see processes.stop_process_tree).
        with open(log, mode) as out:
            process = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=cwd or self.work_dir, start_new_session=True,
            )
        self._processes.append(process)
        return process

    def superlink_command(self) -> list[str]:
        """The ``flower-superlink`` command line of this federation."""
        command = [str(self._bin_dir / "flower-superlink"), "--host", HOST, "--port", str(self.port),
                   "--isolation", "subprocess", "--disable-runtime-dependency-installation"]
        if self.tls is None:
            return command + ["--insecure"]
        command += ["--ssl-ca-certfile", str(self.tls.ca_certificate), "--ssl-certfile", str(self.tls.server_certificate),
                    "--ssl-keyfile", str(self.tls.server_key)]
        if self.security.auth:
            command += ["--enable-supernode-auth", "--database", str(self.work_dir / "superlink.db")]
        return command

    def _start_superlink(self) -> subprocess.Popen:
        self.port = free_port()
        log = self.log_dir / "superlink.log"
        process = self._spawn(self.superlink_command(), self._env("superlink"), log)
        _wait_until(lambda: _listening(HOST, self.port), process, log, f"the SuperLink to listen on {HOST}:{self.port}")
        return process

    def start_supernode(self, partition_id: int, num_partitions: int, key: KeyPair | None = None,
                        wait: bool = True, name: str = "", data_path: Path | None = None) -> SuperNode:
        """Start a SuperNode holding ``partition_id``; with ``wait``, return once it has joined.

        ``key``: its authentication key pair (needed when the SuperLink authenticates
        SuperNodes; it is admitted only if the public key was registered). ``name``
        names its log and FLWR_HOME (default ``supernode-<partition_id>``). ``data_path``:
        the node's own data (node config ``data-path``), in place of its partition of the run's
        data set, and its client state in ``<name>-client-state`` beside its log (``client-state-dir``).
        """
        name = name or f"supernode-{partition_id}"
        # Basin's, polling every 0.2 s (experiments/runtime/supernode_command.py), or Flower's own with the speed-ups off.
        supernode = ([str(self._bin_dir / "flower-supernode")] if speed_ups_off_because()
                     else [sys.executable, "-m", "experiments.runtime.supernode_command"])
        command = [
            *supernode, "--superlink", f"{HOST}:{self.port}", "--port", str(free_port()),
            "--isolation", "subprocess", "--node-config", f"partition-id={partition_id} num-partitions={num_partitions}"
            + (f' {NODE_DATA_PATH}="{data_path}" {NODE_CLIENT_STATE_DIR}="{self.log_dir / (name + "-client-state")}"'
               if data_path is not None else "")]
        command += ["--root-certificates", str(self.tls.ca_certificate)] if self.tls else ["--insecure"]
        if key is not None:
            command += ["--auth-supernode-private-key", str(key.private_key)]
        log = self.log_dir / f"{name}.log"
        log.write_text("")
        env = self._supernode_env(name)
        if self._clientapp_command is not None and (path := warm_clientapp.server_socket(env["FLWR_HOME"])) is not None:
            # Its ClientApps are forked from a process that imported their runtime once
            # (clients/warm_clientapp.py); that process writes to the node's log.
            env = {**env, "PATH": f"{self._clientapp_command.parent}{os.pathsep}{env['PATH']}",
                   warm_clientapp.SOCKET_VARIABLE: path}
            self._spawn([sys.executable, "-m", "clients.warm_clientapp", path, *warm_clientapp.IMPORTS], env, log,
                        cwd=APP_DIR, mode="a")
        node = SuperNode(partition_id, self._spawn(command, env, log, mode="a"), log, key)
        self.supernodes.append(node)
        if wait:
            self._wait_joined(node)
        return node

    def _wait_joined(self, node: SuperNode) -> None:
        _wait_until(lambda: node.node_id is not None, node.process, node.log,
                    f"SuperNode {node.partition_id} to join the SuperLink")

    def start_supernodes(self, num_clients: int, node_data: Path | None = None) -> list[SuperNode]:
        """Start one SuperNode per partition (registering a fresh key for each when
        authentication is on) and wait until all have joined; with ``node_data``, node K
        reads its own data from ``node_data``/node-K (experiments.write_partitions' folders)."""
        keys: list[KeyPair | None] = [None] * num_clients
        if self.security.auth:
            keys = [write_supernode_key_pair(self.work_dir / "keys", f"supernode-{k}") for k in range(num_clients)]
            for key in keys:
                self.register(key.public_key)
        nodes = [self.start_supernode(k, num_clients, keys[k], wait=False,
                                      data_path=node_data / NODE_FOLDER.format(k) if node_data else None)
                 for k in range(num_clients)]
        for node in nodes:
            self._wait_joined(node)
        return nodes

    def stop(self) -> None:
        """Stop every process started here, with all their descendants, then remove the
        temporary directory.

        A SuperNode that exited by itself (e.g. refused by the SuperLink) leaves its
        SuperExec orphaned, outside any tree: processes are also found by their
        FLWR_HOME, which every descendant inherits from the process started here.
        """
        with deferred_interrupts():
            roots = [process.pid for process in self._processes]
            if self._temp is not None:
                roots += processes_of_home(self._temp.name)
            stop_process_tree(roots, grace=3.0)
            for process in self._processes:
                process.wait()
            self._processes.clear()
            if self._temp is not None:
                self._temp.cleanup()
                self._temp = None
            if self._guardian is not None:
                self._guardian.stop()
                self._guardian = None

    # --- flwr CLI ----------------------------------------------------------------

    def _write_cli_config(self) -> None:
        """The ``flwr`` CLI's ``config.toml``: one remote federation, the default."""
        entry = {"address": f"{HOST}:{self.port}"}
        if self.tls is None:
            entry["insecure"] = True
        else:
            entry["root-certificates"] = str(self.tls.ca_certificate)
        text = tomli_w.dumps({"superlink": {"default": self.name, self.name: dict(entry)}})
        (self._home("cli") / "config.toml").write_text(text)

    def flwr(self, *args: str) -> str:
        """Run a ``flwr`` CLI command against this federation; its stdout, or DeploymentError."""
        # Wide enough that rich does not wrap the JSON output of ``--format json``.
        result = subprocess.run([str(self._bin_dir / "flwr"), *args], env={**self._env("cli"), "COLUMNS": "1000"},
                                capture_output=True, text=True, cwd=APP_DIR, timeout=120)
        if result.returncode != 0:
            raise DeploymentError(f"`flwr {' '.join(args)}` failed ({result.returncode}):\n{result.stdout}{result.stderr}")
        return result.stdout

    def register(self, public_key: Path) -> int:
        """Register a SuperNode's public key with the SuperLink; the node id it reserves."""
        reply = self.flwr("supernode", "register", str(public_key), self.name, "--format", "json")
        return int(json.loads(reply)["node-id"])

    def list_supernodes(self) -> list[dict[str, Any]]:
        """``flwr supernode list``: one dict per node the SuperLink knows (node-id, status …)."""
        return json.loads(self.flwr("supernode", "list", self.name, "--format", "json"))["nodes"]

    def run_app(self, app: Path, log_path: Path, run_config: str = "", timeout: float = 600.0) -> str:
        """Run any Flower app (a folder with its pyproject.toml) on this federation with
        ``flwr run --stream``; return its log (also written to ``log_path``)."""
        command = [str(self._bin_dir / "flwr"), "run", str(app), self.name, "--stream"]
        command += ["--run-config", run_config] if run_config else []
        with open(log_path, "w") as log:
            subprocess.run(command, env=self._env("cli"), stdout=log, stderr=subprocess.STDOUT, cwd=app, timeout=timeout)
        return log_path.read_text(errors="replace")

    def run(self, config: Mapping[str, Any], out_dir: Path, progress: bool = True, label: str = "") -> dict[str, Any]:
        """Submit one run with ``flwr run`` and wait for it; its summary, or RunFailed."""
        out_dir = Path(out_dir).resolve()
        out_dir.mkdir(parents=True, exist_ok=True)
        config = validate_run_config({**config, "output-dir": str(out_dir)})
        (out_dir / "summary.json").unlink(missing_ok=True)
        run_config_path = out_dir / "run-config.toml"
        run_config_path.write_text(tomli_w.dumps(dict(config)))
        app = self._home("cli") / "app"
        if not app.is_dir():
            stage_app(app)
        command = [str(self._bin_dir / "flwr"), "run", str(app), self.name, "--stream", "--run-config", str(run_config_path)]
        log_path = out_dir / "flwr.log"
        with open(log_path, "w") as log:
            process = subprocess.Popen(command, env=self._env("cli"), stdout=log, stderr=subprocess.STDOUT, cwd=APP_DIR)
        try:
            follow_run(process, out_dir, config["num-rounds"], progress, label or f"{out_dir.name} ({self.security.name})", True)
        finally:
            if process.poll() is None:
                process.terminate()
            process.wait()

        summary = read_summary(out_dir)
        if summary is None or summary.get("status") != "completed":
            context = ""
            if self.superlink.poll() is not None:
                context = f" (the SuperLink exited with {self.superlink.returncode})\n{_tail(self.log_dir / 'superlink.log')}"
            raise run_failure(out_dir, config, log_path, context)
        return summary


def deploy(config: Mapping[str, Any], out_dir: Path, security: Security = Security(), cpus_per_client: float = 1.0,
           progress: bool = True, overwrite: bool = False, node_data: Path | None = None) -> dict[str, Any]:
    """Run one validated config on a fresh local deployment; its summary, or RunFailed /
    DeploymentError. Logs of every process are written to ``out_dir``. With ``node_data``
    each SuperNode K reads its own data from ``node_data``/node-K."""
    out_dir = create_output_dir(out_dir, "output directory")
    with OutputLock(out_dir):
        check_folder_reuse(out_dir, config, overwrite)  # another config's results: refused before anything starts
        read_checkpoint(out_dir, {**config, "output-dir": str(out_dir)})  # refused before the SuperLink starts
        try:
            with LocalFederation(out_dir, security, cpus_per_client) as federation:
                record_holder(out_dir, str(federation.work_dir))
                federation.start_supernodes(int(config["num-clients"]), node_data)
                return federation.run(config, out_dir, progress)
        except KeyboardInterrupt:  # recorded once every process is stopped: the rows are final
            end_summary(out_dir, config, "interrupted", interrupted_reason(out_dir, config))
            raise


# --- helpers -----------------------------------------------------------------------


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(_read(path).splitlines()[-lines:])


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _wait_until(ready: Callable[[], bool], process: subprocess.Popen, log: Path, what: str,
                timeout: float = STARTUP_TIMEOUT) -> None:
    """Poll ``ready`` until true; DeploymentError with the log's tail if the process exits
    or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None:
            raise DeploymentError(f"gave up waiting for {what}: the process exited with {process.returncode}\n"
                                  f"--- last lines of {log} ---\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise DeploymentError(f"timed out waiting for {what} ({timeout:.0f} s)\n--- last lines of {log} ---\n{_tail(log)}")
        time.sleep(0.2)
