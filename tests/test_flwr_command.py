"""`flwr run` as Basin's launcher starts it: its local SuperLink started first, then
Flower's command line, which finds it answering and starts none; and the run's
`flwr-simulation`, Basin's entry point to Flower's."""

from __future__ import annotations

import http.server
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from experiments.runtime import flwr_command
from experiments.runtime.processes import free_port


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802  (http.server's name)
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_waiting_ends_when_the_superlink_answers_or_has_exited():
    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert flwr_command.wait_until_answering(idle, str(server.server_address[1]), timeout=5.0)
        silent = str(free_port())
        assert not flwr_command.answering(silent)
        started = time.monotonic()
        assert not flwr_command.wait_until_answering(idle, silent, timeout=0.5)  # nothing answers: gives up
        assert time.monotonic() - started < 30.0  # (bounds far from the timeouts: they hold on a loaded machine)
        exited = subprocess.Popen([sys.executable, "-c", "pass"])
        exited.wait()
        started = time.monotonic()
        assert not flwr_command.wait_until_answering(exited, silent, timeout=300.0)  # its SuperLink is gone: at once
        assert time.monotonic() - started < 60.0
    finally:
        idle.kill()
        idle.wait()
        server.shutdown()


def test_the_runs_flower_configuration_names_a_local_superlink_with_its_state_in_memory(tmp_path, monkeypatch):
    from flwr.cli.flower_config import read_superlink_connection

    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    flwr_command.write_flower_config(tmp_path / "home")
    connection = read_superlink_connection()  # what `flwr run` connects to
    assert connection.name == "local" and connection.address == ":local-in-memory:"
    (tmp_path / "home" / "config.toml").write_text('[superlink]\ndefault = "mine"\n\n[superlink.mine]\naddress = ":local:"\n')
    flwr_command.write_flower_config(tmp_path / "home")  # one that is there is kept
    assert read_superlink_connection().name == "mine"


@pytest.mark.slow
def test_flwr_run_uses_the_superlink_started_before_it_and_starts_none(tmp_path, monkeypatch, capsys):
    """A real flower-superlink, started as flwr_command starts it: once it answers, Flower's
    `ensure_local_superlink` (what `flwr run` calls) connects to it without starting one."""
    from flwr.cli import local_superlink
    from flwr.cli.typing import SuperLinkConnection

    from experiments.runtime.processes import stop_process_tree

    port, control = str(free_port()), str(free_port())
    environ = {**os.environ, "FLWR_HOME": str(tmp_path), "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": port,
               "FLWR_LOCAL_CONTROL_API_PORT": control,
               "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}
    superlink = flwr_command.start_local_superlink(environ)
    assert f"Starting local SuperLink on 127.0.0.1:{port}" in capsys.readouterr().out  # the stage progress shows
    try:
        assert flwr_command.wait_until_answering(superlink, port), (tmp_path / "local-superlink" / "superlink.log")
        monkeypatch.setattr(local_superlink, "LOCAL_SUPERLINK_HTTP_API_PORT", port)
        monkeypatch.setattr(local_superlink, "_start_local_superlink",
                            lambda *args: pytest.fail("flwr run started a second SuperLink"))
        connection = local_superlink.ensure_local_superlink(
            SuperLinkConnection(name="local", address=":local-in-memory:"))
        assert connection.address == f"127.0.0.1:{port}"
        assert superlink.poll() is None
    finally:
        stop_process_tree([superlink.pid], grace=1.0)


def test_a_superlink_that_does_not_answer_is_stopped_before_flowers_command_line_starts_its_own(monkeypatch):
    import flwr.cli.app

    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    ran = []
    monkeypatch.setenv("FLWR_HOME", "/nonexistent")
    monkeypatch.setenv("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", str(free_port()))  # nothing answers there
    monkeypatch.setattr(flwr_command, "start_local_superlink", lambda environ: silent)
    monkeypatch.setattr(flwr_command, "wait_until_answering", lambda superlink, port: False)
    monkeypatch.setattr(flwr.cli.app, "app", lambda: ran.append(silent.poll()) or 0)
    try:
        assert flwr_command.main(["run", "."]) == 0
        assert ran and ran[0] is not None  # gone before Flower's `flwr run` ran
    finally:
        silent.kill()
        silent.wait()


def test_a_superlink_of_another_run_on_the_runs_port_is_never_joined(monkeypatch, capsys):
    """The run's SuperLink could not take its port (it exited) and another SuperLink answers
    there: Flower's command line would join it, and the other run's end would end this one."""
    import flwr.cli.app

    other = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    monkeypatch.setenv("FLWR_HOME", "/nonexistent")
    monkeypatch.setenv("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", str(other.server_address[1]))
    monkeypatch.setattr(flwr_command, "start_local_superlink", lambda environ: exited)
    monkeypatch.setattr(flwr.cli.app, "app", lambda: pytest.fail("Flower's command line ran"))
    try:
        assert flwr_command.main(["run", "."]) == 1
    finally:
        other.shutdown()
    assert f"another SuperLink answers on 127.0.0.1:{other.server_address[1]}" in capsys.readouterr().err


def test_ports_handed_out_at_once_are_never_the_same_one_twice():
    """Runs launched at once (threads) each name their own SuperLink, control and Ray ports:
    the kernel hands a port that was just closed out again, and two runs then shared one
    SuperLink (an end-to-end test's two runs did, and the first run's end ended the second)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=8) as pool:
        ports = list(pool.map(lambda _: free_port(), range(3000)))
    assert len(set(ports)) == len(ports)


def _fake_app(tmp_path: Path, simulation_engine: str) -> Path:
    """A staged app whose clients/simulation_engine.py is ``simulation_engine`` (and the real
    clients/warm_simulation.py, which the run's command loads first, and the modules of
    clients/ that the run's `flwr` loads: experiments/runtime/flwr_command.py)."""
    app = tmp_path / "app"
    (app / "clients").mkdir(parents=True)
    (app / "clients" / "__init__.py").write_text("")
    (app / "clients" / "simulation_engine.py").write_text(simulation_engine)
    for module in ("warm_simulation.py", "log.py"):
        shutil.copy(Path(__file__).parents[1] / "clients" / module, app / "clients")
    shutil.copytree(Path(__file__).parents[1] / "clients" / "flower_internals", app / "clients" / "flower_internals")
    (app / "preloaded.py").write_text("")
    return app


def test_the_runs_flwr_simulation_is_found_first_and_runs_basins_entry_point_from_the_staged_app(tmp_path):
    """The SuperExec starts `flwr-simulation` by name: the run's PATH finds the launcher's,
    which runs clients.simulation_engine.run_flower_simulation from the staged app (the
    FAB's sources), passes Flower's arguments through, and exits with its status."""
    from experiments.runtime.warm_processes import write_warm_command

    app = _fake_app(tmp_path, "import sys\n"
                              "def run_flower_simulation():\n"
                              "    print(__file__, sys.argv[0].endswith('/flwr-simulation'), sys.argv[1:])\n"
                              "    return 3\n")
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = write_warm_command(home, app)
    path = f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    assert shutil.which("flwr-simulation", path=path) == str(bin_dir / "flwr-simulation")
    result = subprocess.run(["flwr-simulation", "--runtime-api-address", "127.0.0.1:1"], env={**os.environ, "PATH": path},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 3, result.stderr
    assert result.stdout.split(" ", 2) == [str(app / "clients" / "simulation_engine.py"), "True",
                                           "['--runtime-api-address', '127.0.0.1:1']\n"]


REPORTING_SIMULATION = ("import os, sys, time\n"
                        "def run_flower_simulation():\n"
                        "    print(os.getpid(), os.getcwd(), os.environ.get('RUN_ONLY'), 'preloaded' in sys.modules,\n"
                        "          sys.argv[1:], flush=True)\n"
                        "    time.sleep(float(os.environ.get('SIMULATE_SECONDS', '0')))\n"
                        "    return 3\n")


@pytest.fixture
def warm_processes():
    """Warm processes a test starts, killed at its end whatever happened."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def _wait_for_socket(home: Path) -> None:
    """Until the warm process listens (in a run, it does long before Flower starts the command)."""
    deadline = time.monotonic() + 30
    while not (home / "warm-simulation.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def _run_command(home: Path, app: Path, cwd: Path, **env: str) -> subprocess.Popen:
    from experiments.runtime.warm_processes import write_warm_command

    if not (home / "bin").exists():
        write_warm_command(home, app)
    return subprocess.Popen([str(home / "bin" / "flwr-simulation"), "--token", "t"], cwd=cwd, env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_runs_simulation_command_hands_itself_over_to_the_warm_process_with_its_streams_and_environment(
        tmp_path, warm_processes):
    """The launcher's warm process (clients/warm_simulation.py) imports first, then runs the
    simulation for the run's command: with the command's arguments, environment, working
    folder and standard output, and the command exits with its status. Without one, the
    command runs the simulation itself."""
    from experiments.runtime.warm_processes import start_warm_simulation

    app = _fake_app(tmp_path, REPORTING_SIMULATION)
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    warm = start_warm_simulation(home, app, dict(os.environ), imports=("preloaded",))
    warm_processes.append(warm)
    _wait_for_socket(home)
    command = _run_command(home, app, elsewhere, RUN_ONLY="from the command")
    out, err = command.communicate(timeout=60)
    assert command.returncode == 3, err
    pid, cwd, value, preloaded, argv = out.split(" ", 4)
    assert (int(pid), cwd, value, preloaded) == (warm.pid, str(elsewhere), "from", "the")  # split of "from the command"
    assert argv.strip().endswith("True ['--token', 't']")
    assert warm.wait(timeout=120) == 3 and not (home / "warm-simulation.sock").exists()
    alone = _run_command(home, app, elsewhere, RUN_ONLY="x")  # no warm process: the command runs it
    out, err = alone.communicate(timeout=60)
    assert alone.returncode == 3 and int(out.split()[0]) == alone.pid and out.split()[3] == "False", err


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGKILL])
def test_the_warm_process_gets_the_commands_signals_and_ends_with_it(tmp_path, signal_number, warm_processes):
    """Flower's SuperExec and Basin's clean-up stop the simulation by signalling its
    command: a signal it can catch reaches the warm process, and where the command is
    killed the warm process ends at once."""
    from experiments.runtime.warm_processes import start_warm_simulation

    app = _fake_app(tmp_path, REPORTING_SIMULATION)
    home = tmp_path / "home"
    home.mkdir()
    warm = start_warm_simulation(home, app, dict(os.environ), imports=("preloaded",))
    warm_processes.append(warm)
    _wait_for_socket(home)
    command = _run_command(home, app, tmp_path, SIMULATE_SECONDS="60")
    assert int(command.stdout.readline().split()[0]) == warm.pid  # the warm process runs it
    command.send_signal(signal_number)
    # The warm process ends on the event (the signal, or the command's end of its socket); the
    # ceiling only guards against a hang (a loaded 2-core machine once took over 10 s).
    assert warm.wait(timeout=120) == (-signal.SIGTERM if signal_number == signal.SIGTERM else -signal.SIGKILL)
    assert command.wait(timeout=120) != 0


def test_a_jobs_warm_processes_are_forked_from_one_that_imported_once_and_end_with_it(tmp_path):
    """On a job's own cluster each run's warm process is forked from the job's fork server
    (experiments/runtime/simulation_forks.py), which made the imports once: each run's
    command hands itself over to its own child of that server, with its environment and
    working folder. When the job ends (or its launcher dies: the same end of file) the
    server ends, and so does a child that no command reached."""

    import psutil

    from experiments.runtime.processes import alive
    from experiments.runtime.simulation_forks import ForkedProcess, SimulationForks
    from experiments.runtime.warm_processes import start_warm_simulation

    app = _fake_app(tmp_path, REPORTING_SIMULATION)
    (tmp_path / "job").mkdir()
    job = SimulationForks(tmp_path / "job")
    try:
        warm, replies = [], []
        for index in range(3):
            home = tmp_path / f"home-{index}"
            home.mkdir()
            warm.append(start_warm_simulation(home, app, dict(os.environ), job,
                                              imports=("preloaded",)))
        assert all(isinstance(process, ForkedProcess) and process.forked.wait(60) for process in warm)
        # One server, which imported `preloaded` before forking them.
        servers = {psutil.Process(process.pid).ppid() for process in warm}
        assert servers == {job._server.pid}
        for index in range(2):  # the third run's command never comes
            command = _run_command(tmp_path / f"home-{index}", app, tmp_path, RUN_ONLY=f"run{index}")
            out, err = command.communicate(timeout=120)
            assert command.returncode == 3, err
            replies.append(out.split(" ", 4))
        assert [int(reply[0]) for reply in replies] == [warm[0].pid, warm[1].pid]
        assert [reply[1:4] for reply in replies] == [[str(tmp_path), "run0", "True"], [str(tmp_path), "run1", "True"]]
        assert not alive(warm[0].pid) and alive(warm[2].pid)
    finally:
        job.close()
        for process in warm:
            if isinstance(process, subprocess.Popen):  # not forked (what this test is for): its own process
                process.kill()
                process.wait()
    assert not alive(warm[2].pid) and not alive(servers.pop())


def test_a_runs_flwr_superlink_and_superexec_commands_hand_themselves_over_to_children_of_its_fork_server(tmp_path):
    """A run's `flwr`, SuperLink and SuperExec are forked from a fork server, its job's or its
    own (launch.start_warm_commands), once that has imported the commands' modules: the
    launcher starts `flwr` and Flower the others by name, the run's own command (in its bin
    folder, first on its PATH) hands itself over to its child of the server, which runs what
    the command runs (here `--help`: Flower's, or for `flwr` Basin's
    experiments.runtime.flwr_command, which for anything but `run` is Flower's) with the
    command's streams and exits with its status. Without a warm process any more, the
    command runs itself. A run's own server keeps the run's FLWR_HOME in its environment, and
    so do its children: Basin's clean-up finds them by it (processes.stop_home), and the
    server leaves them to it when it ends (a child whose command never came: the simulation's
    here), so that they are stopped in its order."""
    from experiments.runtime.processes import alive, processes_of_home, stop_home
    from experiments.runtime.simulation_forks import SimulationForks
    from experiments.runtime.warm_processes import WARM_COMMANDS, start_warm_commands, start_warm_simulation

    app = _fake_app(tmp_path, REPORTING_SIMULATION)
    home = tmp_path / "home"
    home.mkdir()
    forks = SimulationForks(home, run_own=True)
    forked = {}
    try:
        forked = start_warm_commands(home, app, {**os.environ, "FLWR_HOME": str(home)}, forks)
        assert list(forked) == list(WARM_COMMANDS) and all(process.forked.wait(60) for process in forked.values())
        assert forks._server is not None
        assert {forks._server.pid, *(process.pid for process in forked.values())} <= set(processes_of_home(home))
        # An option only that command's help names.
        only_in_help = {"flwr": "Create new Flower App", "flower-superlink": "--control-api-address",
                        "flower-superexec": "--parent-pid"}
        for name, process in forked.items():
            done = subprocess.run([str(home / "bin" / name), "--help"], capture_output=True, text=True, timeout=120)
            assert done.returncode == 0 and only_in_help[name] in done.stdout, done.stderr
            assert not (home / f"warm-{name}.sock").exists()  # its child took the command over
            deadline = time.monotonic() + 60
            while alive(process.pid) and time.monotonic() < deadline:  # and ended with it
                time.sleep(0.01)
            assert not alive(process.pid)
        alone = subprocess.run([str(home / "bin" / "flower-superexec"), "--help"], capture_output=True, text=True,
                               timeout=120)  # no warm process any more: Flower's command runs
        assert alone.returncode == 0 and only_in_help["flower-superexec"] in alone.stdout, alone.stderr
        simulation = start_warm_simulation(home, app, {**os.environ, "FLWR_HOME": str(home)}, forks,
                                           imports=("preloaded",))
        assert simulation.forked.wait(60) and simulation.pid is not None
        forks.close()
        assert alive(simulation.pid) and simulation.pid in processes_of_home(home)
        stop_home(home, grace=0.0)
        assert not alive(simulation.pid)
    finally:
        forks.close()
        for process in [*forked.values(), *([simulation] if "simulation" in locals() else [])]:
            process.kill()


# Two children of a process that imported the job's fork server's modules: each writes the
# first Ray object ID it draws, as a run's Ray driver does when it starts (its plasma warm-up),
# in one write (print's two, unbuffered as CI runs Python, interleaved the children's lines).
FORKED_RAY_IDS = """
import os
from clients.warm_simulation import import_all
from experiments.runtime.warm_processes import warm_job_imports
import_all(list(warm_job_imports()))
import ray
for _ in range(2):
    if os.fork() == 0:
        os.write(1, (ray.ObjectID.from_random().hex() + "\\n").encode())
        os._exit(0)
os.wait()
os.wait()
"""


def test_runs_forked_from_a_jobs_fork_server_draw_different_ray_ids():
    """The fork server's imports leave Ray's ID generator unseeded, so each forked run seeds
    its own. Seeded before the fork (Flower's Ray backend, imported there, makes its actor
    class with a random ID), two runs' Ray drivers drew the same IDs: the second to start
    died of a plasma object that already existed (`--parallel 2` sweeps, 2 in 3 here)."""
    result = subprocess.run([sys.executable, "-c", FORKED_RAY_IDS], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr[-2000:]
    ids = result.stdout.split()
    assert len(ids) == 2 and ids[0] != ids[1], ids
