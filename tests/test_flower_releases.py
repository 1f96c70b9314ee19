"""Basin beside the Flower a researcher has: the speed-ups that reach into Flower's private
code run on the releases they were checked against, and on any other release, or with
``BASIN_SPEEDUPS=off``, Flower's own commands run, decided before anything private is
imported (clients/flower_internals/). A real run with the speed-ups off:
tests/test_end_to_end.py; the other release's fast tier and main job: .ci/run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from clients import flower_internals
from experiments.runtime import flwr_command
from experiments.runtime import launch as launching
from experiments.runtime.run_config import resolve_config


@pytest.mark.parametrize("installed, switch, reason", [
    ("1.41.0", "on", ""),
    ("1.42.0", None, ""),
    ("1.42.0", "off", "BASIN_SPEEDUPS=off"),
    ("1.43.0", None, "this is flwr 1.43.0, not 1.41.0 or 1.42.0"),
    ("1.40.1", "on", "this is flwr 1.40.1, not 1.41.0 or 1.42.0"),
])
def test_the_speed_ups_run_on_the_checked_releases_unless_switched_off(monkeypatch, installed, switch, reason):
    monkeypatch.setattr(flower_internals.releases, "installed_flower", lambda: installed)
    if switch is None:
        monkeypatch.delenv(flower_internals.SPEED_UPS_SWITCH, raising=False)
    else:
        monkeypatch.setenv(flower_internals.SPEED_UPS_SWITCH, switch)
    assert flower_internals.speed_ups_off_because() == reason


def test_the_switch_turns_every_speed_up_off_without_a_word(monkeypatch, capsys):
    monkeypatch.setenv(flower_internals.SPEED_UPS_SWITCH, "off")
    flower_internals.speed_up_available.cache_clear()
    try:
        assert not any(flower_internals.speed_up_available(name) for name in flower_internals.SPEED_UPS)
    finally:
        flower_internals.speed_up_available.cache_clear()
    assert capsys.readouterr().out == ""


class Followed(Exception):
    """Raised by the stand-in for following the run, once it has seen the launch."""


@pytest.mark.parametrize("why", ["switch", "release"])
def test_with_the_speed_ups_off_a_launch_runs_flowers_own_commands(tmp_path, monkeypatch, why):
    """Flower's ``flwr`` (not experiments.runtime.flwr_command, which starts the SuperLink
    itself), Flower's ``flwr-simulation`` (no Basin command first on the run's PATH), and no
    warm simulation process (it imports Flower's engine)."""
    if why == "switch":
        monkeypatch.setenv(flower_internals.SPEED_UPS_SWITCH, "off")
    else:
        monkeypatch.setattr(flower_internals.releases, "installed_flower", lambda: "1.43.0")
    seen = {}

    def follow_run(process, out_dir, *args, **kwargs):
        app = Path(process.args[2])
        seen.update(command=process.args[:2], basin_simulation_command=(app.parent / "bin").exists())
        raise Followed

    def no_warm_simulation(*args, **kwargs):
        raise AssertionError("a warm simulation process was started")

    monkeypatch.setattr(launching, "flwr_executable", lambda: "/no/such/flwr")
    monkeypatch.setattr(launching, "follow_run", follow_run)
    monkeypatch.setattr(launching, "start_warm_simulation", no_warm_simulation)
    monkeypatch.setattr(launching.subprocess, "Popen", _recording_popen(launching.subprocess.Popen))
    with pytest.raises(Followed):
        launching.launch(resolve_config({"num-rounds": 1, "num-clients": 2}), tmp_path / "run", progress=False)
    assert seen == {"command": ["/no/such/flwr", "run"], "basin_simulation_command": False}


def _recording_popen(popen):
    """Popen, which for a command that cannot be started returns a finished stand-in
    keeping its arguments (the launch's ``flwr``, here a path that does not exist)."""

    class Finished:
        def __init__(self, args):
            self.args, self.returncode = args, 1

        def poll(self):
            return 1

    def start(args, *rest, **kwargs):
        if args and args[0] == "/no/such/flwr":
            return Finished(list(args))
        return popen(args, *rest, **kwargs)

    return start


def test_with_the_speed_ups_off_flwr_run_starts_no_superlink_of_basins(tmp_path, monkeypatch):
    monkeypatch.setenv(flower_internals.SPEED_UPS_SWITCH, "off")
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))

    def started(environ):
        raise AssertionError("Basin started the local SuperLink")

    monkeypatch.setattr(flwr_command, "start_local_superlink", started)
    monkeypatch.setattr(sys, "argv", sys.argv[:])
    with pytest.raises(SystemExit) as exit_:
        flwr_command.main(["run", "--help"])
    assert exit_.value.code == 0
    assert not (tmp_path / "config.toml").exists()  # Flower's own configuration, as flwr writes it
