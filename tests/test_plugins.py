"""A researcher's method from their own package (entry points ``basin.methods``): found,
run by Basin's commands unchanged, and when broken one line naming the plug-in, its
distribution and the problem, raised only when asked for or listed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clients.options import ConfigError
from experiments.runtime.run_config import APP_DIR, default_run_config
from strategies.config import validate_run_config
from strategies.methods import registry as methods
from strategies.methods.registry import BrokenPlugin, Plugin, load_registry

EXAMPLE = APP_DIR / "examples" / "feddecorr"
FEDLC = APP_DIR / "examples" / "fedlc"
SMALL_CNN = APP_DIR / "examples" / "small-cnn"

GOOD = '''
from strategies.methods import objective_method
from clients.options import Option

METHODS = (objective_method("{name}", "Good", lambda *args: None, ("{key}",),
           options={{"{key}": Option(float, "a number", lambda v: v >= 0, default=0.5)}}),)
'''


def _module(tmp_path: Path, monkeypatch, name: str, text: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _problem(registry, name: str) -> str:
    assert name not in registry.methods and name not in registry.averagings
    return registry.broken[name].line()


def test_a_good_plugin_adds_its_method_and_keys(tmp_path, monkeypatch):
    module = _module(tmp_path, monkeypatch, "plugin_good", GOOD.format(name="good-method", key="good-weight"))
    registry = load_registry([Plugin("good-method", module, "good-dist")])
    assert registry.methods["good-method"].build is not None  # FedAvg sending the objective, given by the registry
    assert registry.plugins["good-method"].distribution == "good-dist" and not registry.broken


def test_each_kind_of_broken_plugin_is_one_line_naming_it_its_distribution_and_the_problem(tmp_path, monkeypatch):
    failing = _module(tmp_path, monkeypatch, "plugin_failing", "import a_module_that_is_not_there\n")
    misnamed = _module(tmp_path, monkeypatch, "plugin_misnamed", GOOD.format(name="other-name", key="misnamed-weight"))
    malformed = _module(tmp_path, monkeypatch, "plugin_malformed", "METHODS = ('not a declaration',)\n")
    clashing_key = _module(tmp_path, monkeypatch, "plugin_key", GOOD.format(name="key-clash", key="prox-mu"))
    general_key = _module(tmp_path, monkeypatch, "plugin_general", GOOD.format(name="general-key", key="lr"))
    twice = _module(tmp_path, monkeypatch, "plugin_twice", GOOD.format(name="twice", key="twice-weight"))
    registry = load_registry([
        Plugin("failing", failing, "dist-a"), Plugin("misnamed", misnamed, "dist-b"),
        Plugin("malformed", malformed, "dist-c"), Plugin("fedavg", twice, "dist-d"),
        Plugin("key-clash", clashing_key, "dist-e"), Plugin("general-key", general_key, "dist-i"),
        Plugin("twice", twice, "dist-f"), Plugin("twice", twice, "dist-g"),
        Plugin("colon", "plugin_twice:METHODS", "dist-h"), Plugin("none", twice, "dist-j"),
    ])
    assert _problem(registry, "failing") == (
        "plug-in 'failing' (distribution dist-a, module plugin_failing) cannot be used: importing it failed: "
        "ModuleNotFoundError: No module named 'a_module_that_is_not_there'")
    assert "its module declares no method named 'misnamed' (it declares 'other-name')" in _problem(registry, "misnamed")
    assert "dist-c" in _problem(registry, "malformed") and "MethodSpec or AveragingSpec" in _problem(registry, "malformed")
    assert "dist-d" in registry.broken["fedavg"].line() and "one of Basin's own methods" in registry.broken["fedavg"].line()
    assert registry.methods["fedavg"].display_name == "FedAvg"  # Basin's own is kept
    assert "means no averaging rule" in _problem(registry, "none") and "own methods" not in _problem(registry, "none")
    assert "run-config key 'prox-mu' is declared differently" in _problem(registry, "key-clash")
    assert "run-config key 'lr' is one of Basin's general keys" in _problem(registry, "general-key")
    assert "also a plug-in of dist-g" in _problem(registry, "twice")
    assert "must be a module" in _problem(registry, "colon")
    assert all("\n" not in broken.line() for broken in registry.broken.values())


def test_the_loaders_holes_are_each_one_line_at_load(tmp_path, monkeypatch):
    """A module that calls sys.exit (any BaseException but KeyboardInterrupt), one that
    declares a method no entry point names, a declaration malformed as it is built (not "an
    import failure"), and objective_keys naming no declared key: each that plug-in's line,
    at load, before any run (the last failed as a KeyError in the ServerApp after Flower started)."""
    exits = _module(tmp_path, monkeypatch, "plugin_exits", "import sys\nsys.exit(3)\n")
    several = _module(tmp_path, monkeypatch, "plugin_several", GOOD.format(name="first", key="first-weight")
                      + GOOD.format(name="second", key="second-weight").replace("METHODS = (", "METHODS += ("))
    malformed = _module(tmp_path, monkeypatch, "plugin_built_wrong", '''
        from strategies.methods import objective_method
        from clients.options import Option

        METHODS = (objective_method("built-wrong", "BuiltWrong", lambda *args: None, model_needs="a GPU"),)
        ''')
    keys = _module(tmp_path, monkeypatch, "plugin_keys", GOOD.format(name="keys", key="keys-weight").replace(
        '("keys-weight",)', '("keys-weight", "keys-wieght")'))
    registry = load_registry([Plugin("exits", exits, "dist-a"), Plugin("first", several, "dist-b"),
                              Plugin("built-wrong", malformed, "dist-c"), Plugin("keys", keys, "dist-d")])
    assert _problem(registry, "exits").endswith("cannot be used: importing it failed: SystemExit: 3")
    assert _problem(registry, "first").endswith(
        "its module also declares 'second', which no entry point names (one entry point per method: add second = "
        "plugin_several to [project.entry-points.\"basin.methods\"])")
    assert _problem(registry, "built-wrong").endswith(
        "a declaration of its module is malformed: built-wrong: model_needs = 'a GPU'; allowed: any, image, "
        "slimmable-residual")
    assert _problem(registry, "keys").endswith(
        "its objective_keys name 'keys-wieght', which neither it (options) nor Basin (`--list-keys`) declares")
    both = load_registry([Plugin("first", several, "dist-b"), Plugin("second", several, "dist-b")])
    assert {"first", "second"} <= set(both.methods) and not both.broken  # an entry point for each: both load


def test_a_plugin_importing_the_method_types_from_their_earlier_module_is_told_where_they_are(tmp_path, monkeypatch):
    earlier = _module(tmp_path, monkeypatch, "plugin_earlier", GOOD.format(name="earlier", key="earlier-weight").replace(
        "from strategies.methods import objective_method", "from clients.declarations import objective_method"))
    registry = load_registry([Plugin("earlier", earlier, "dist-a")])
    assert _problem(registry, "earlier").endswith(
        "importing it failed: ImportError: objective_method is in strategies.methods now: "
        "from strategies.methods import objective_method")


def test_a_plugin_whose_module_imports_torch_is_named_in_the_listing(tmp_path):
    """Basin's launcher loads no torch; the listing names a plug-in whose module brings it in."""
    env = _installed_entry_point(tmp_path, "heavy", "plugin_heavy", "import torch\n" + GOOD.format(name="heavy",
                                                                                                  key="heavy-w"))
    listed = subprocess.run([sys.executable, "-m", "experiments.method_list"], env=env, capture_output=True, text=True,
                            timeout=120, cwd=APP_DIR, check=True).stdout.splitlines()
    heavy = next(line for line in listed if line.startswith("heavy "))
    assert heavy.endswith("; its module imports torch into the launcher: name its torch code with ImplementedIn "
                          "(docs/extending.md)]")
    assert not any("imports torch" in line for line in listed if not line.startswith("heavy "))


def test_a_broken_plugin_is_refused_only_when_a_run_asks_for_it(monkeypatch):
    broken = BrokenPlugin(Plugin("decorr-typo", "decorr_typo", "dist-x"), "importing it failed: SyntaxError")
    monkeypatch.setitem(methods.BROKEN_PLUGINS, "decorr-typo", broken)
    validate_run_config(default_run_config())  # every other method still runs
    for key in ("strategy", "averaging"):
        with pytest.raises(ConfigError) as error:
            validate_run_config({**default_run_config(), key: "decorr-typo"})
        assert str(error.value) == (f"run config key '{key}' = 'decorr-typo': plug-in 'decorr-typo' (distribution "
                                    f"dist-x, module decorr_typo) cannot be used: importing it failed: SyntaxError")


def _installed_entry_point(directory: Path, name: str, module: str, text: str) -> dict[str, str]:
    """A distribution in ``directory`` (as ``pip install --target`` leaves one) with one entry point."""
    info = directory / "plugin_dist-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugin-dist\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[basin.methods]\n{name} = {module}\n")
    (directory / f"{module}.py").write_text(textwrap.dedent(text))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(directory), str(APP_DIR)])}


def test_an_installed_broken_plugin_is_listed_and_refused_in_one_line_and_other_runs_are_not_touched(tmp_path):
    env = _installed_entry_point(tmp_path, "broken-method", "broken_method", "raise RuntimeError('half-written')\n")
    listed = subprocess.run([sys.executable, "-m", "experiments.run", "--list-keys"], env=env, capture_output=True,
                            text=True, timeout=120, cwd=APP_DIR)
    assert listed.returncode == 0
    line = ("plug-in 'broken-method' (distribution plugin-dist, module broken_method) cannot be used: importing it "
            "failed: RuntimeError: half-written")
    assert listed.stdout.splitlines()[-1] == f"error: {line}"
    asked = subprocess.run([sys.executable, "-m", "experiments.run", "--set", "strategy=broken-method", "--out",
                            str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=120, cwd=APP_DIR)
    assert asked.returncode == 2 and "Traceback" not in asked.stderr
    assert asked.stderr.strip().endswith(f"run config key 'strategy' = 'broken-method': {line}")
    assert not (tmp_path / "out" / "flwr.log").exists()  # refused before Flower started


def test_a_plugin_that_declares_a_tensor_beside_its_model_is_refused_under_dp_in_one_line_before_flower(tmp_path):
    """A plug-in's objective that sends a tensor besides the model declares it
    (``reply_records``); under server-side DP, which clips and noises the model update
    only, the launcher refuses it in one line naming the method and the tensor, in either
    order, before Flower starts; without DP it is accepted."""
    env = _installed_entry_point(tmp_path, "sends-more", "sends_more", '''
        from strategies.methods import objective_method

        METHODS = (objective_method("sends-more", "SendsMore", lambda *args: None,
                                    reply_records={"objective-record": "per class, its mean logit"}),)
        ''')
    for order in ("inside", "outside"):
        out = tmp_path / f"out-{order}"
        asked = subprocess.run([sys.executable, "-m", "experiments.run", "--set", "strategy=sends-more", "--set",
                                "dp-clipping-norm=1", "--set", f"dp-order={order}", "--out", str(out)], env=env,
                               capture_output=True, text=True, timeout=120, cwd=APP_DIR)
        assert asked.returncode == 2 and "Traceback" not in asked.stderr, asked.stderr[-2000:]
        assert asked.stderr.strip().splitlines()[-1].endswith(
            "strategy = 'sends-more' also sends 'objective-record' (per class, its mean logit), which would leave the "
            "client unclipped and un-noised; allowed: dp-clipping-norm = 0, or a strategy that sends only its model")
        assert not (out / "flwr.log").exists()  # refused before Flower started


@pytest.mark.slow
def test_the_example_plugins_installed_with_pip_run_end_to_end_with_and_without_averaging(tmp_path):
    """examples/feddecorr and examples/fedlc (a method that sees its client's label counts)
    and examples/small-cnn (a model) installed as a user would (pip, into a folder of their
    own), found by their entry points: listed with their keys, loading no torch into the
    launcher, and run on the model plug-in by `experiments.run --compare` through Flower and
    Ray, alone and composed with IMA (one job: one Ray cluster, the same client processes),
    with nothing in Basin edited."""
    target = tmp_path / "site"
    for example in (EXAMPLE, FEDLC, SMALL_CNN):
        package = tmp_path / example.name
        shutil.copytree(example, package, ignore=shutil.ignore_patterns("__pycache__"))  # build files stay out of the repo
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "--target", str(target), str(package)], check=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(APP_DIR)])}
    keys = subprocess.run([sys.executable, "-m", "experiments.run", "--list-keys"], env=env, capture_output=True,
                          text=True, timeout=120, cwd=APP_DIR, check=True).stdout
    assert "'feddecorr'" in keys and any(line.startswith("feddecorr-beta ") for line in keys.splitlines())
    assert "'fedlc'" in keys and any(line.startswith("fedlc-tau ") for line in keys.splitlines())
    assert "(plug-ins: 'small-cnn')" in keys
    launcher = ("import sys\nfrom strategies.config import validate_run_config\nfrom experiments.method_list import listing\n"
                "listing()\nprint('torch' in sys.modules)\n")
    assert subprocess.run([sys.executable, "-c", launcher], env=env, capture_output=True, text=True, timeout=120,
                          cwd=APP_DIR, check=True).stdout.split() == ["False"]
    out = tmp_path / "runs"
    result = subprocess.run(
        [sys.executable, "-m", "experiments.run", "--set", "feddecorr-beta=0.2", "--set", "fedlc-tau=0.5",
         "--set", "model=small-cnn",
         "--set", "num-rounds=2", "--set", "num-clients=4", "--set", "window=2", "--set", "avg-start=2",
         "--compare", "strategy=feddecorr,fedlc", "--compare", "averaging=none,ima", "--out", str(out), "--quiet"],
        env=env, capture_output=True, text=True, timeout=600, cwd=APP_DIR)
    assert result.returncode == 0, result.stderr[-3000:]
    folders = sorted(path.parent for path in out.glob("*/summary.json"))
    assert len(folders) == 4
    for folder in folders:
        summary = json.loads((folder / "summary.json").read_text())
        config = json.loads((folder / "config.json").read_text())
        assert summary["status"] == "completed" and summary["rounds"] == 2
        assert (config["feddecorr-beta"], config["fedlc-tau"], config["model"]) == (0.2, 0.5, "small-cnn")
        # Every sampled client built the plug-in's objective (an unknown objective fails the client).
        assert "client failures" not in result.stderr and summary["client-failures"] == 0
    runs = {(json.loads((f / "config.json").read_text())["strategy"], json.loads((f / "config.json").read_text())[
        "averaging"]) for f in folders}
    assert runs == {("feddecorr", "none"), ("feddecorr", "ima"), ("fedlc", "none"), ("fedlc", "ima")}
    # The Python API takes them as the command line does.
    api = ("from experiments.api import run\n"
           f"job = run(set={{'strategy': 'fedlc', 'model': 'small-cnn', 'num-rounds': 2, 'num-clients': 4}}, "
           f"out={str(tmp_path / 'api')!r}, progress=False)\n"
           "print(job.summary['acc-final'].notna().all())\n")
    done = subprocess.run([sys.executable, "-c", api], env=env, capture_output=True, text=True, timeout=300, cwd=APP_DIR)
    assert done.returncode == 0 and done.stdout.split()[-1] == "True", done.stderr[-3000:]
    # A sweep file takes the plug-in's keys (validated as the sweep loads; it runs its runs
    # as the job above did).
    sweep = tmp_path / "plug-in.toml"
    sweep.write_text('name = "plug-in"\n[set]\nstrategy = "feddecorr"\nnum-rounds = 2\nnum-clients = 4\nwindow = 2\n'
                     '[grid]\naveraging = ["wima"]\nfeddecorr-beta = [0.05, 0.1]\n')
    listed = subprocess.run([sys.executable, "-m", "experiments.sweep", str(sweep), "--out", str(tmp_path / "sweep"),
                             "--list"], env=env, capture_output=True, text=True, timeout=120, cwd=APP_DIR)
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert "sweep plug-in: 2 runs" in listed.stdout and listed.stdout.count(" pending ") == 2
    sweep.write_text(sweep.read_text().replace("feddecorr-beta = [0.05, 0.1]", "feddecorr-beta = [-1.0]"))
    refused = subprocess.run([sys.executable, "-m", "experiments.sweep", str(sweep), "--out", str(tmp_path / "sweep"),
                              "--list"], env=env, capture_output=True, text=True, timeout=120, cwd=APP_DIR)
    assert refused.returncode == 2 and "feddecorr-beta" in refused.stderr, refused.stderr[-3000:]
