"""Methods are declared once (strategies/methods/: method_spec.py, averaging_spec.py, registry.py): every table is
derived from the declarations, no module names a method it does not declare, every
declared method runs end to end, and the worked examples of docs/extending.md hold to
their equations."""

from __future__ import annotations

import ast
import importlib
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from experiments.runtime.method_keys import PYPROJECT, pyproject_block
from strategies.config import SCHEMA, validate_run_config
from strategies.methods import ImplementedIn, MethodSpec
from strategies.methods.registry import METHOD_MODULES, METHODS_BY_NAME, method_options

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("strategies", "clients", "partitions", "experiments")


def _declaring_files() -> dict[str, set[Path]]:
    """Method name → the files of its own modules: the one that declares it, and those of
    its client half (its objective's and components' modules)."""
    files: dict[str, set[Path]] = {}
    for module_name in METHOD_MODULES:
        for spec in importlib.import_module(module_name).METHODS:
            parts = [spec.objective, *spec.client_components] if spec.objective else list(spec.client_components)
            modules = {module_name, *(part.module if isinstance(part, ImplementedIn) else part.__module__ for part in parts)}
            files[spec.name] = {Path(importlib.import_module(m).__file__).resolve() for m in modules}
    return files


def test_a_method_is_named_only_by_the_module_that_declares_it():
    """No table elsewhere: a string literal equal to a method's name appears only in the
    method's own modules (docstrings and longer texts may mention it). FedAvg, the
    reference every comparison is measured against, may be named as that reference."""
    declaring = _declaring_files()
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                          if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                          and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
            for node in ast.walk(tree):
                if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in METHODS_BY_NAME
                        and node.value != "fedavg" and id(node) not in docstrings
                        and path.resolve() not in declaring[node.value]):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} names {node.value!r}")
    assert not found, "\n".join(found)


def test_no_module_branches_on_an_averaging_rules_name():
    """The clients' schedule and every other rule-specific behaviour come from the rule's
    declaration (AveragingSpec.client_schedule …): no `config["averaging"] == "ima"` outside
    the rule's own module."""
    from strategies.methods.registry import AVERAGINGS_BY_NAME, REGISTRY

    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Compare):
                    names = {c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)} & set(AVERAGINGS_BY_NAME)
                    found += [f"{module}:{node.lineno} compares with {name!r}" for name in names
                              if REGISTRY.modules[name] != module]
    assert not found, "\n".join(found)


def test_the_methods_page_holds_the_table_the_declarations_generate():
    from experiments.method_list import METHODS_PAGE, TABLE_END, TABLE_START, methods_table

    assert f"{TABLE_START}\n{methods_table()}\n{TABLE_END}" in METHODS_PAGE.read_text(), \
        "run `python -m experiments.method_list --write-docs`"
    rows = methods_table().splitlines()[2:]
    assert len(rows) == 28 and rows[2].startswith("| `strategy = fedadam / fedyogi / fedadagrad` |")


def test_every_declared_method_and_averaging_rule_runs_in_a_real_flower_run():
    from strategies.methods.registry import AVERAGINGS_BY_NAME
    from tests.test_checkpoint_resume import RESUMED_METHODS
    from tests.test_end_to_end import RUNS

    configs = [*RUNS.values(), *RESUMED_METHODS.values()]
    assert set(METHODS_BY_NAME) - {config.get("strategy", "fedavg") for config in configs} == set()
    assert set(AVERAGINGS_BY_NAME) - {config.get("averaging", "ima") for config in RESUMED_METHODS.values()} \
        - {config.get("averaging") for config in RUNS.values()} == set()


def test_every_table_is_derived_from_the_declarations():
    from clients.components import ClientComponent
    from experiments.measurement.method_costs import default_methods
    from strategies.config import STRATEGY_NAMES
    from strategies.methods.registry import client_components, objective_builders

    assert STRATEGY_NAMES == tuple(METHODS_BY_NAME) and SCHEMA["strategy"].choices == tuple(METHODS_BY_NAME)
    assert set(method_options()) <= set(SCHEMA)
    assert set(objective_builders()) == {name for name, spec in METHODS_BY_NAME.items() if spec.objective}
    assert all(callable(build) for build in client_components())
    assert default_methods().split(",")[:2] == ["fedavg", "fedavg+crop-flip"] and "gradaug-n2" in default_methods()
    from clients.models import uses_projection_head

    assert [name for name in METHODS_BY_NAME if uses_projection_head("resnet56-bn", name)] == ["moon"]
    assert issubclass(ClientComponent, object) and all(isinstance(spec, MethodSpec) for spec in METHODS_BY_NAME.values())


def test_pyproject_holds_the_declared_method_keys_with_their_defaults():
    """Flower accepts overrides only of keys pyproject.toml declares: its generated block
    must be what the declarations generate (`python -m experiments.method_list --write-pyproject`)."""
    text = PYPROJECT.read_text()
    assert pyproject_block() in text, "run `python -m experiments.method_list --write-pyproject`"
    defaults = tomllib.loads(text)["tool"]["flwr"]["app"]["config"]
    assert set(defaults) == set(SCHEMA)
    assert {key: defaults[key] for key in method_options()} == {key: o.default for key, o in method_options().items()}


@pytest.mark.parametrize("name", METHODS_BY_NAME)
def test_every_method_builds_its_strategy_from_the_default_config(name):
    defaults = tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]
    overrides = {"strategy": name, "momentum": 0.0}
    if METHODS_BY_NAME[name].model_needs == "slimmable-residual":
        overrides["model"] = "resnet20-gn"
    config = validate_run_config({**defaults, **overrides})
    strategy = METHODS_BY_NAME[name].build(config)
    assert hasattr(strategy, "configure_train") and hasattr(strategy, "aggregate_train")


def test_a_key_shared_by_two_methods_is_one_declaration():
    from strategies.fedcm import FEDCM_OPTIONS
    from strategies.sam import SAM_RHO

    assert METHODS_BY_NAME["fedsam"].options["sam-rho"] is METHODS_BY_NAME["mofedsam"].options["sam-rho"] is SAM_RHO
    assert METHODS_BY_NAME["mofedsam"].options["fedcm-alpha"] is FEDCM_OPTIONS["fedcm-alpha"]


def test_the_launchers_checks_load_no_torch(tmp_path):
    """Before Flower starts the launcher validates the run against every declaration,
    checks the machine, the data's partition and the checkpoint: none of it imports torch
    (~2 s of every command on 2 CPU cores). The client halves are imported when first
    called (ImplementedIn), in the client processes."""
    import subprocess
    import sys

    code = f"""
import sys
from pathlib import Path
from experiments.runtime import machine
machine.CUDA_DEVICE_FILES = ("/nonexistent/nvidiactl",)  # as on this CPU machine, also on a GPU one
import experiments.run, experiments.sweep
from experiments.api import run_job
from experiments.runtime.launch import launch
from experiments.runtime.finished_runs import method_label
from experiments.runtime.run_config import resolve_config
from strategies.checkpoint import read_checkpoint
from strategies.methods.registry import METHODS_BY_NAME, client_halves
configs = []
for name, spec in METHODS_BY_NAME.items():
    overrides = {{"strategy": name, "momentum": 0.0}}
    if spec.model_needs == "slimmable-residual":
        overrides["model"] = "resnet20-gn"
    configs.append(resolve_config(overrides))
    method_label(configs[-1])
machine.check_machine(configs, machine.client_resources(configs, 1.0, None))
assert read_checkpoint(Path({str(tmp_path)!r}), configs[0]) is None
assert client_halves().objectives and client_halves().components
print(sorted(name for name in sys.modules if name == "torch" or name.startswith("torch.")))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_declared_key_without_a_default_is_refused_as_the_declaration_is_built():
    from clients.declarations import DeclarationError
    from clients.options import Option
    from strategies.methods import AveragingSpec

    no_default = {"bare-key": Option(float, "a number")}
    with pytest.raises(DeclarationError, match="bare-method: option.s. bare-key declare no default"):
        MethodSpec("bare-method", "Bare", lambda config: None, options=no_default)
    with pytest.raises(DeclarationError, match="bare-rule: option.s. bare-key declare no default"):
        AveragingSpec("bare-rule", "Bare", lambda base, config: base, options=no_default)


def test_the_method_vocabulary_loads_no_registry_so_a_declaring_module_imported_first_is_registered_whole():
    """``strategies.methods`` (what a declaring module imports) loads neither the registry nor
    torch: were the registry loaded then, it would import the declaring module half-done, and
    IMA, WIMA and SWA would be missing without an error."""
    import subprocess
    import sys

    code = """
import sys
import strategies.averaging
print("strategies.methods.registry" in sys.modules, "torch" in sys.modules)
from strategies.methods.registry import AVERAGINGS_BY_NAME
print(sorted(AVERAGINGS_BY_NAME))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["False False", "['ema', 'ima', 'swa', 'wima']"]


def test_a_client_half_named_where_it_is_defined_is_imported_at_its_first_call(tmp_path, monkeypatch):
    import sys

    (tmp_path / "half_module.py").write_text(
        "def builder(*args):\n    return ('built', args)\n\n"
        "def factory(key):\n    return lambda *args: (key, args)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "half_module", raising=False)
    builder = ImplementedIn("half_module:builder")
    assert "half_module" not in sys.modules and builder.module == "half_module"
    assert builder(1, 2) == ("built", (1, 2)) and "half_module" in sys.modules
    made = ImplementedIn("half_module:factory", ("server-key",))
    assert made("model") == ("server-key", ("model",))
    # Equal where they name the same builder: one component per message, however many methods share it.
    assert builder == ImplementedIn("half_module:builder") and len({builder, ImplementedIn("half_module:builder")}) == 1
    assert made != ImplementedIn("half_module:factory", ("other-key",))
    from strategies.methods.registry import client_components

    proximal = ImplementedIn("clients.components:proximal")
    assert METHODS_BY_NAME["fedprox"].client_components == METHODS_BY_NAME["fedacg"].client_components == (proximal,)
    assert client_components().count(proximal) == 1


# -- the worked examples of docs/extending.md ----------------------------------------------
def test_clipped_fedavg_clips_each_update_to_c_then_takes_the_weighted_mean():
    from strategies.fedavg_clip import clipped_mean_update

    w = {"w": np.array([1.0, 1.0], dtype=np.float32), "count": np.array(4, dtype=np.int64)}
    clients = [
        {"w": np.array([4.0, 5.0], dtype=np.float32), "count": np.array(6, dtype=np.int64)},  # Δ = (3, 4), ‖Δ‖ = 5
        {"w": np.array([1.5, 1.0], dtype=np.float32), "count": np.array(6, dtype=np.int64)},  # Δ = (0.5, 0): kept
    ]
    new = clipped_mean_update(w, clients, [1, 3], clip_norm=1.0)
    # Δ̃_1 = (3, 4)/5 = (0.6, 0.8); w + ¼·(0.6, 0.8) + ¾·(0.5, 0) = (1.525, 1.2)
    assert new["w"].tolist() == pytest.approx([1.525, 1.2]) and new["w"].dtype == np.float32
    assert int(new["count"]) == 6  # a counter is averaged, never clipped
    # C larger than every update: FedAvg's weighted mean.
    assert clipped_mean_update(w, clients, [1, 3], 100.0)["w"].tolist() == pytest.approx([1.0 + 0.75 + 0.375, 2.0])


def test_label_smoothing_is_cross_entropy_against_smoothed_targets():
    from clients.objectives.label_smoothing import LabelSmoothing

    model = torch.nn.Linear(3, 4)
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 2, 3, 0])
    loss = LabelSmoothing(0.2).backward(model, x, y)
    log_p = F.log_softmax(model(x), dim=1)
    target = torch.full((5, 4), 0.2 / 4)
    target[torch.arange(5), y] += 0.8  # (1 − ε)·[k = y] + ε/C
    assert float(loss.detach()) == pytest.approx(float(-(target * log_p).sum(dim=1).mean().detach()), rel=1e-6)
    assert model.weight.grad is not None


def test_the_ema_is_beta_times_the_average_plus_one_minus_beta_times_the_model():
    from flwr.serverapp.strategy import FedAvg

    from strategies.ema import ExponentialAveraging

    ema = ExponentialAveraging(FedAvg(), decay=0.75, start_round=2)
    for w in ([4.0, 0.0], [0.0, 8.0], [8.0, 4.0]):
        ema._sample({"w": np.array(w, dtype=np.float32)})
    # w_EMA = w¹ = (4, 0); then ¾·(4, 0) + ¼·(0, 8) = (3, 2); then ¾·(3, 2) + ¼·(8, 4) = (4.25, 2.5)
    assert ema._average({"w": np.zeros(2, np.float32)})["w"].tolist() == [4.25, 2.5]
    restored = ExponentialAveraging(FedAvg(), decay=0.75, start_round=2)
    restored.load_state_dict(ema.state_dict())  # checkpointable: its one copy and count
    assert restored.running_mean["w"].tolist() == [4.25, 2.5] and restored.num_averaged == 3


def test_the_cosine_lr_schedule_is_the_same_under_every_method():
    """lr-schedule = cosine: lr_t = lr₀(1 + cos(π(t−1)/R))/2 for any strategy (the FedSWA comparison)."""
    from experiments.runtime.run_config import resolve_config
    from strategies.methods.strategy_builder import build_client_schedule

    for strategy in ("fedavg", "scaffold", "fedswa", "fedmoswa", "fedlesam"):
        config = resolve_config({"strategy": strategy, "lr-schedule": "cosine", "lr": 0.1, "num-rounds": 10,
                                 "momentum": 0.0})
        schedule = build_client_schedule(config)
        assert schedule(1)[0] == pytest.approx(0.1) and schedule(6)[0] == pytest.approx(0.05)
        assert schedule(10)[0] == pytest.approx(0.1 * (1 + np.cos(np.pi * 0.9)) / 2)
    official = resolve_config({"strategy": "fedmoswa", "fedswa-variant": "official-code", "lr-decay": 0.9,
                               "momentum": 0.0})
    assert build_client_schedule(official)(3)[0] == pytest.approx(official["lr"] * 0.81)  # no special case
