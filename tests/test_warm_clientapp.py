"""A local SuperNode's `flwr-clientapp` (clients/warm_clientapp.py): handed over to the
node's warm process, which forks a child for each command that runs Flower's ClientApp
command with the command's arguments, streams and exit status; where no warm process
answers, Flower's own command runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from clients.warm_clientapp import SOCKET_VARIABLE, server_socket, write_command
from experiments.runtime.run_config import APP_DIR

FLOWERS_HELP = "Run a Flower ClientApp"


def test_each_command_runs_flowers_clientapp_in_a_child_forked_from_the_warm_process(tmp_path):
    command = write_command(tmp_path / "bin", APP_DIR)
    home = tmp_path / "home"
    home.mkdir()
    path = server_socket(str(home))
    log = tmp_path / "warm.log"
    with open(log, "w") as out:
        server = subprocess.Popen([sys.executable, "-m", "clients.warm_clientapp", path, "flwr.supernode.cli.flwr_clientapp"],
                                  cwd=APP_DIR, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60  # it listens before its imports: a command then waits for them
        while not os.path.exists(path):
            assert time.monotonic() < deadline and server.poll() is None, log.read_text()
            time.sleep(0.01)
        env = {**os.environ, SOCKET_VARIABLE: path}
        helped = [subprocess.run([str(command), "--help"], env=env, capture_output=True, text=True, timeout=60)
                  for _ in range(2)]
        refused = subprocess.run([str(command), "--insecure"], env=env, capture_output=True, text=True, timeout=60)
    finally:
        server.kill()
        server.wait()
    for done in helped:
        assert done.returncode == 0 and FLOWERS_HELP in done.stdout, done.stderr
    # Flower's own refusal (argparse: no task token), on the command's standard error, with its exit status.
    assert refused.returncode == 2 and "flwr-clientapp: error: one of the arguments --token" in refused.stderr
    forks = re.findall(r"a ClientApp process \((\d+)\) forked from the warm one \((\d+)\)", log.read_text())
    assert len(forks) == 3 and len({child for child, _ in forks}) == 3 and {warm for _, warm in forks} == {str(server.pid)}


def test_where_no_warm_process_answers_flowers_own_command_runs(tmp_path):
    command = write_command(tmp_path / "bin", APP_DIR)
    env = {**os.environ, SOCKET_VARIABLE: str(tmp_path / "nobody.sock")}
    done = subprocess.run([str(command), "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and FLOWERS_HELP in done.stdout, done.stderr
    assert Path(command).read_text().startswith(f"#!{sys.executable}\n")
