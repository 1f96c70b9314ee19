"""requirements.lock, what experiments/setup.sh installs, holds what pyproject.toml asks for."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
LOCKED_EXTRAS = ("test", "tracking", "privacy")  # the extras experiments/setup.sh and experiments/lock.sh install
REFRESH = "refresh it: bash experiments/lock.sh"


def locked_versions(text: str) -> dict[str, str]:
    """{canonical name: version} of a lock's ``name==version`` lines."""
    pins = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            name, separator, pinned = line.partition("==")
            assert separator and pinned.strip(), f"requirements.lock: {line!r} is not name==version; {REFRESH}"
            pins[canonicalize_name(name)] = pinned.strip()
    return pins


def unmet(pyproject: dict, pins: dict[str, str]) -> list[str]:
    """pyproject.toml's requirements (its dependencies and LOCKED_EXTRAS) that ``pins`` lack or contradict."""
    project = pyproject["project"]
    wanted = [*project["dependencies"], *(r for extra in LOCKED_EXTRAS for r in project["optional-dependencies"][extra])]
    problems = []
    for requirement in map(Requirement, wanted):
        pinned = pins.get(canonicalize_name(requirement.name))
        if pinned is None:
            problems.append(f"{requirement} is not in it")
        elif not requirement.specifier.contains(pinned, prereleases=True):
            problems.append(f"{requirement} but it holds {requirement.name}=={pinned}")
    return problems


def test_the_lock_holds_what_pyproject_asks_for():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    problems = unmet(pyproject, locked_versions((REPO / "requirements.lock").read_text()))
    assert not problems, f"requirements.lock no longer matches pyproject.toml: {'; '.join(problems)}; {REFRESH}"


def test_a_range_the_lock_does_not_satisfy_is_named_with_how_to_refresh():
    pyproject = {"project": {"dependencies": ["torch>=2.14.1,<2.16", "pandas>=2.2"],
                             "optional-dependencies": {"test": ["ruff==0.18.0"], "tracking": [], "privacy": []}}}
    assert unmet(pyproject, locked_versions("torch==2.14.1\nruff==0.17.6\n")) == [
        "pandas>=2.2 is not in it", "ruff==0.18.0 but it holds ruff==0.17.6"]


def test_the_set_up_on_a_disk_without_room_stops_in_one_line_before_it_installs(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "experiments").mkdir(parents=True)
    for name in ("experiments/setup.sh", "experiments/check-free-disk.sh", "pyproject.toml", "requirements.lock"):
        shutil.copy(REPO / name, checkout / name)
    # more than any disk has: the check must refuse, where pip would fill the disk and stop half-way
    setup = subprocess.Popen(["bash", "experiments/setup.sh"], cwd=checkout, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True,
                             env={**os.environ, "BASIN_MIN_FREE_GIB": str(2**40)})
    try:
        _, stderr = setup.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # it went on to install: stop pip with it
        os.killpg(setup.pid, signal.SIGKILL)
        setup.communicate()
        raise
    assert setup.returncode == 1
    assert stderr.startswith("error: installing Basin into .venv needs about 1099511627776 GiB free on the disk of ")
    assert not (checkout / ".venv").exists()
