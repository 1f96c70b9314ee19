"""Shared fixtures: small label vectors, the location of Fashion-MNIST, small local hub sets,
a server identity, and the second tier's Flower runs that several tests read (flower_runs)."""

from __future__ import annotations

import os

# torch's OpenMP threads spin for a while after each parallel region before they sleep
# (libgomp's default wait policy): beside another busy process on the same cores, the
# spinning takes the CPU that process needs (the docs pages' commands, two at once on 2
# cores: 121 CPU-s and 92 s with spinning, 93 CPU-s and 80 s without). Passive threads sleep
# at once and compute the same bits. Set before torch is loaded, here and in every process
# the tests start (they inherit it).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import atexit
import gzip
import shutil
import signal
import string
import struct
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.supercore.task_identity import TaskIdentity

from strategies.methods.registry import hand_over_client_halves
from tests.time_checks import SecondsPerTest, check_time

hand_over_client_halves()  # tests run client code in this process, as the ClientApp's entry does in a client's

REPO = Path(__file__).resolve().parents[1]

# The suite's own Hugging Face datasets cache. Loading the miniature hub sets caches them
# under their folder names (digit-five, cifar100, femnist, …), and in a user's cache those
# entries would pass for the real sets afterwards. Set here, before any test module
# imports `datasets` (it reads the variable at import); Flower and Ray runs inherit it.
# A second import of this file under another module name (``tests.conftest`` beside pytest's
# ``conftest``) reuses the folder: a second one would be made after the session started and
# count as left behind. Child processes inherit the variable but make their own (other pid).
_OWNED_CACHE = os.environ.get("BASIN_TEST_HF_DATASETS_CACHE", "").partition(":")
if _OWNED_CACHE[0] == str(os.getpid()):
    _HF_DATASETS_CACHE = _OWNED_CACHE[2]
else:
    _HF_DATASETS_CACHE = tempfile.mkdtemp(prefix="basin-test-hf-datasets-")
    os.environ["BASIN_TEST_HF_DATASETS_CACHE"] = f"{os.getpid()}:{_HF_DATASETS_CACHE}"
    atexit.register(shutil.rmtree, _HF_DATASETS_CACHE, ignore_errors=True)
os.environ["HF_DATASETS_CACHE"] = _HF_DATASETS_CACHE
# The suite uses no network (CI has none), and says so to the Hugging Face libraries, also
# before they are imported: online, they ask the hub about a set before loading it from
# the cache, which where there is no network took seconds per load (one `reproduce --list`
# 26 s instead of 3 once the miniature sets were cached). Flower and Ray runs inherit it.
os.environ["HF_HUB_OFFLINE"] = "1"


def _stop_as_on_ctrl_c(signum, frame):
    raise KeyboardInterrupt


# A test run stopped with SIGTERM (a timeout, a CI runner) ends as on Ctrl-C: fixtures tear
# down and the folder above is removed, where Python's default would end the process at once.
if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _stop_as_on_ctrl_c)


def _latest_ray_session_link() -> tuple[Path, str]:
    """Ray's ``session_latest`` link and the session it names ('' where there is none)."""
    latest = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray" / "session_latest"
    try:
        return latest, os.readlink(latest)
    except OSError:
        return latest, ""


def _leftovers(before: tuple[set[Path], set[Path], str]) -> list[str]:
    """Ray session folders whose Ray has ended, Ray's ``session_latest`` link left naming a
    removed one, and /tmp/basin-* folders made since ``before``."""
    from experiments.runtime.processes import alive, ray_sessions, session_owner

    sessions, temporary, latest_before = before
    ended = [s for s in ray_sessions() - sessions if (owner := session_owner(s)) is not None and not alive(owner)]
    latest, target = _latest_ray_session_link()
    dangling = [f"{latest} (names the removed {target})"] if target not in ("", latest_before) and not latest.exists() else []
    basin = set(Path(tempfile.gettempdir()).glob("basin-*")) - temporary - {Path(_HF_DATASETS_CACHE)}
    return sorted(map(str, [*ended, *basin])) + dangling


def _is_xdist_worker(config) -> bool:
    """Whether this process is one of pytest-xdist's workers (``-n``): its controller, not
    a worker, sees the whole test run."""
    return hasattr(config, "workerinput")


def pytest_configure(config):
    # The fast tier runs on pytest-xdist's workers, one per CPU core (README's test command):
    # torch's default of one thread per core in each worker oversubscribes the cores (on 2
    # cores: 332 s for the fast tier with 2 workers, 151 s without workers, 94 s with 2
    # workers of one thread each; 2026-11-28).
    if _is_xdist_worker(config):
        import torch

        torch.set_num_threads(1)


def pytest_sessionstart(session):
    from experiments.runtime.processes import ray_sessions

    # Checked once, by pytest-xdist's controller: a worker's verdict does not reach the run's
    # exit status, and it would wait on folders that other workers' tests still use.
    if _is_xdist_worker(session.config):
        return
    session.config.basin_before = (ray_sessions(), set(Path(tempfile.gettempdir()).glob("basin-*")),
                                   _latest_ray_session_link()[1])
    session.config.basin_started = time.monotonic()
    session.config.basin_test_seconds = SecondsPerTest()
    session.config.pluginmanager.register(session.config.basin_test_seconds, "basin-test-seconds")


def pytest_sessionfinish(session, exitstatus):
    """CI's checks of a whole test run (.ci/run sets them). With BASIN_TEST_AIM_S, one line
    says how long the run took against that aim (met or missed: an aim, never a failure);
    with BASIN_TEST_GATE_S, a run longer than that fails, naming its slowest tests (a broken
    run: a hang, a test that waits for nothing). With BASIN_TEST_SECONDS_FILE too, both are
    for every run that adds its seconds to that file (the fast and the second tier
    together). With BASIN_CHECK_LEFTOVERS=1, a run that leaves a Ray session folder (or
    Ray's session_latest link to a removed one) or a /tmp/basin-* folder behind fails,
    naming them (a run's clean-up, which may end a moment after its test, gets 30 s)."""
    if not hasattr(session.config, "basin_before"):
        return
    took = time.monotonic() - session.config.basin_started
    check_time(session, took, os.environ.get("BASIN_TEST_AIM_S"), os.environ.get("BASIN_TEST_GATE_S"),
                os.environ.get("BASIN_TEST_SECONDS_FILE"))
    if os.environ.get("BASIN_CHECK_LEFTOVERS") != "1":
        return
    deadline = time.monotonic() + float(os.environ.get("BASIN_LEFTOVER_GRACE_S", "30"))
    while (left := _leftovers(session.config.basin_before)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        session.config.get_terminal_writer().line(f"error: the test run left these behind: {', '.join(left)}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def data_cache(tmp_path_factory) -> Path:
    """The suite's own cache of decoded data sets and partitions (partitions/cache.py), so
    tests neither read a user's entries nor leave theirs behind; every Flower run of the
    suite (Flower and Ray pass the environment down) shares it."""
    directory = tmp_path_factory.mktemp("basin-cache")
    previous = os.environ.get("BASIN_CACHE_DIR")
    os.environ["BASIN_CACHE_DIR"] = str(directory)
    yield directory
    if previous is None:
        del os.environ["BASIN_CACHE_DIR"]
    else:
        os.environ["BASIN_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def miniature_hub(tmp_path_factory) -> dict[str, Path]:
    """Small local copies of hub sets (CIFAR-100 with coarse labels, a Digit-Five-like
    multi-domain set, FEMNIST-like writers, Shakespeare-like text): tests/miniature.py."""
    from tests.miniature import build_all

    return build_all(tmp_path_factory.mktemp("miniature-hub"))


# Tests (not the project) may use the copy in ../shared; the project reads data-dir.
FASHION_MNIST_DIRS = [Path("/usr/share/datasets/fashion-mnist"), REPO.parent / "shared" / "data" / "fashion-mnist"]


@pytest.fixture
def labels() -> np.ndarray:
    """6 000 labels, 10 balanced classes, in a shuffled order."""
    return np.random.default_rng(1).permutation(np.repeat(np.arange(10), 600))


@pytest.fixture(scope="session")
def fashion_mnist_dir() -> Path:
    for directory in FASHION_MNIST_DIRS:
        if (directory / "train-images-idx3-ubyte.gz").is_file() or (directory / "train-images-idx3-ubyte").is_file():
            return directory
    pytest.skip("Fashion-MNIST IDX files not found (apt-get install dataset-fashion-mnist)")


def write_idx(path: Path, array: np.ndarray, magic: bytes | None = None, extra: bytes = b"") -> None:
    """An unsigned-byte IDX file, gzipped, as Fashion-MNIST ships (``magic``: another first
    four bytes; ``extra``: bytes after the values, as damaged files have)."""
    header = (magic or struct.pack(">HBB", 0, 0x08, array.ndim)) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes() + extra)


def write_tiny_fashion_mnist(directory: Path) -> Path:
    """Four small, complete IDX .gz files with Fashion-MNIST's names, in ``directory``."""
    from partitions.availability import IDX_STEMS

    directory.mkdir(parents=True, exist_ok=True)
    for stem in IDX_STEMS:
        count = 20 if stem.startswith("train") else 10
        array = np.zeros((count, 28, 28)) if "images" in stem else np.arange(count) % 10
        write_idx(directory / f"{stem}.gz", array)
    return directory


@pytest.fixture
def tiny_fashion_mnist(tmp_path) -> Path:
    """Four small, complete IDX .gz files with Fashion-MNIST's names."""
    return write_tiny_fashion_mnist(tmp_path)


@pytest.fixture
def server_identity():
    """Messages are stamped with the sender's run and node id, as inside a ServerApp."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = None


SCOPE_VARIABLE = "BASIN_TEST_SCOPE"


def processes_in_scope(scope: str) -> set[int]:
    """Live processes whose environment carries ``BASIN_TEST_SCOPE=scope``: what a test's
    own launches started (Flower and Ray pass the environment down), never another job's."""
    marker = f"{SCOPE_VARIABLE}={scope}".encode()
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                found.add(int(proc.name))
        except OSError:
            continue
    return found


def flower_logs_of_unfinished(runs: list[Path]) -> str:
    """The last lines of Flower's log of each run folder that did not complete, for a failed
    assertion's message: a sweep prints one line per failed run, and a test's folder is gone
    once later test sessions rotate it out (a resumed sweep's run failed once in a fresh
    clone's CI, its ServerApp's process gone after round 2, with nothing left to say why)."""
    from experiments.runtime.flower_log import read_summary

    tails = []
    for run in runs:
        if (read_summary(run) or {}).get("status") == "completed":
            continue
        log = run / "flwr.log"
        lines = log.read_text(errors="replace").splitlines()[-60:] if log.is_file() else ["(no flwr.log)"]
        tails.append(f"\n--- {log} ---\n" + "\n".join(lines))
    return "".join(tails)


@pytest.fixture
def scoped_env() -> tuple[dict[str, str], str]:
    """(environment, scope) for subprocesses whose leftovers a test checks with processes_in_scope."""
    scope = uuid.uuid4().hex
    return {**os.environ, SCOPE_VARIABLE: scope}, scope


# ---- Flower runs that several tests read --------------------------------------------

# One run alone leaves part of CI's 2 cores idle (Flower's polling and process start-up):
# 4 runs took 32.5 s two at once instead of 38.2 s one at a time (2 cores, 2026-11-27). The
# second tier's whole batch (~30 runs; `pytest -m "slow and flower_runs" --setup-only`),
# 2 cores, 2026-11-30: two at once 175 s and 173 s (88 % busy), three 164 s twice (91 %),
# four 177 s.
RUNS_AT_ONCE = 3


@dataclass
class Launched:
    """One finished `flwr run` of ``flower_runs``: its config and output folder, or how it failed."""

    config: dict[str, Any]
    out: Path
    summary: dict[str, Any] | None
    error: BaseException | None

    def completed(self) -> Path:
        """The run's folder; raises how it failed where it did not complete."""
        if self.error is not None:
            raise self.error
        assert self.summary is not None and self.summary["status"] == "completed"
        return self.out

    def rows(self):
        import pandas as pd

        return pd.read_csv(self.completed() / "results.csv")


def _flower_runs_of(item: pytest.Item) -> list[str]:
    """The names in the item's ``flower_runs`` marks (its function's and its parameter's)."""
    return [name for marker in item.iter_markers("flower_runs") for name in marker.args]


@pytest.fixture(scope="session")
def flower_runs(request, tmp_path_factory) -> dict[str, Launched]:
    """The runs that this session's selected tests name with ``@pytest.mark.flower_runs(*names)``,
    launched together when the first of those tests starts, RUNS_AT_ONCE at a time on one Ray
    cluster, as a sweep's job runs them. A test module declares the settings of the names its
    tests use in ``FLOWER_RUNS`` (name → settings over Basin's defaults; a data set
    ``hf:{name}`` is the miniature hub set of that name, tests/miniature.py, and
    ``{fashion_mnist}`` the folder of Fashion-MNIST's IDX files). A name is one
    config in the whole session: a reference run that several tests or modules compare with
    (an uninterrupted run, a run to repeat bit for bit) is launched once, beside the others,
    instead of on its own with its own Ray and Flower start-up."""
    from experiments.runtime.launch import launch
    from experiments.runtime.machine import machine_cpus
    from experiments.runtime.ray_cluster import LocalRayCluster
    from experiments.runtime.run_config import resolve_config

    settings: dict[str, dict[str, Any]] = {}
    for item in request.session.items:
        declared = getattr(item.module, "FLOWER_RUNS", {})
        for name in _flower_runs_of(item):
            if name not in declared:
                raise pytest.UsageError(f"{item.nodeid}: flower_runs({name!r}): {item.module.__name__}.FLOWER_RUNS "
                                        "does not declare it")
            if settings.setdefault(name, declared[name]) != declared[name]:
                raise pytest.UsageError(f"flower_runs({name!r}) is declared with other settings in {item.module.__name__}")
    folders, missing = _data_folders(request, {field for values in settings.values() for field in _placeholders(values)})
    configs = {name: resolve_config({key: value.format(**folders) if isinstance(value, str) else value
                                     for key, value in values.items()})
               for name, values in settings.items() if not _placeholders(values) & set(missing)}
    outs = {name: tmp_path_factory.mktemp(name.replace("+", "-")) for name in configs}
    # One Ray cluster for all of them, as a sweep's job has: each run's own Ray start and
    # client processes cost as much again (6 small runs, 2 at a time: 46.2 s in all with a Ray
    # each, 32.2 s sharing one; 2 cores, 2026-11-27).
    with LocalRayCluster(bool(configs), machine_cpus()) as job_ray, ThreadPoolExecutor(max_workers=RUNS_AT_ONCE) as pool:
        futures = {name: pool.submit(launch, configs[name], outs[name], progress=False, ray_address=job_ray)
                   for name in configs}
    launched = {
        name: Launched(configs[name], outs[name], None if future.exception() else future.result(), future.exception())
        for name, future in futures.items()
    }
    # A run whose data this machine lacks: its tests are skipped, saying why.
    for name, values in settings.items():
        if name not in launched:
            field = sorted(_placeholders(values) & set(missing))[0]
            launched[name] = Launched(values, Path(), None, missing[field])
    return launched


def _placeholders(values: dict[str, Any]) -> set[str]:
    """The ``{name}`` fields in a run's settings (see :func:`_data_folders`)."""
    return {field for value in values.values() if isinstance(value, str)
            for _, field, _, _ in string.Formatter().parse(value) if field}


def _data_folders(request, fields: set[str]) -> tuple[dict[str, Path], dict[str, BaseException]]:
    """The folders that ``flower_runs``' settings name in braces: ``{fashion_mnist}``, the
    Fashion-MNIST IDX files (fixture ``fashion_mnist_dir``), any other name a miniature hub set
    (tests/miniature.py); and, per name this machine lacks, the skip that says so."""
    folders: dict[str, Path] = {}
    missing: dict[str, BaseException] = {}
    if fields - {"fashion_mnist"}:
        folders.update(request.getfixturevalue("miniature_hub"))
    if "fashion_mnist" in fields:
        try:
            folders["fashion_mnist"] = request.getfixturevalue("fashion_mnist_dir")
        except pytest.skip.Exception as skipped:
            missing["fashion_mnist"] = skipped
    return folders, missing
