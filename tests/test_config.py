"""Run-config validation: every bad value is refused with its key, value and what is allowed."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from experiments.runtime.run_config import PRESETS_DIR, default_run_config, load_preset, parse_overrides, resolve_config
from strategies.config import SCHEMA, ConfigError, validate_run_config

BAD_VALUES = [
    ("dataset", "mnist"),
    ("dataset", 3),
    ("model", "resnet-9000"),
    ("partition", "pachinko-typo"),
    ("alpha", -0.1),
    ("alpha", "0.1"),
    ("classes-per-client", 0),
    ("classes-per-client", 1.5),
    ("min-partition-size", -1),
    ("num-clients", 0),
    ("participation", 0.0),
    ("participation", 1.5),
    ("num-rounds", 0),
    ("local-epochs", -2),
    ("batch-size", 0),
    ("lr", 0),
    ("lr", -0.01),
    ("lr-decay", 1.5),
    ("lr-decay", 0),
    ("momentum", 1.0),
    ("weight-decay", -1e-3),
    ("grad-clip", -1),
    ("strategy", "fedsomething"),
    ("seed", -1),
    ("seed", True),
    ("target-accuracy", 1.2),
    ("summary-last-k", -1),
    ("averaging", "polyak"),
    ("window", 0),
    ("avg-start", 0),
    ("avg-start", 2.5),
    ("avg-feedback", "yes"),
    ("avg-subset", "head"),
    ("ima-exploration", "fast"),
    ("ima-decay", 1.5),
    ("swa-cycle", 0),
    ("server-momentum", 1.0),
    ("tau", 0),
    ("prox-mu", -0.1),
    ("device", "tpu"),
    ("round-timeout", 0),
    ("evaluation", "decentralised"),
    ("clients-per-round", -1),
]


def test_defaults_are_valid_and_cover_the_schema():
    config = default_run_config()
    assert set(config) == set(SCHEMA)
    validate_run_config(config)


@pytest.mark.parametrize("key, value", BAD_VALUES)
def test_bad_value_is_refused_with_key_value_and_allowed(key, value):
    config = {**default_run_config(), key: value}
    with pytest.raises(ConfigError) as error:
        validate_run_config(config)
    message = str(error.value)
    assert f"'{key}'" in message and repr(value) in message and "allowed" in message


def test_unknown_and_missing_keys():
    with pytest.raises(ConfigError, match="unknown run config key.*learning-rate"):
        validate_run_config({**default_run_config(), "learning-rate": 0.1})
    config = default_run_config()
    del config["lr"]
    with pytest.raises(ConfigError, match="missing key.*lr"):
        validate_run_config(config)


def test_a_model_for_other_inputs_and_a_cohort_of_no_client_are_refused():
    with pytest.raises(ConfigError, match="'model'"):
        resolve_config({"model": "fmnist-cnn"})  # digits are 8x8
    with pytest.raises(ConfigError, match="'participation'"):
        resolve_config({"num-clients": 4, "participation": 0.1})


def test_federated_evaluation_needs_a_test_split_and_refuses_what_needs_the_servers_data():
    with pytest.raises(ConfigError, match="'evaluation' = 'federated'.*client-evaluation = 0 gives none"):
        resolve_config({"evaluation": "federated"})
    with pytest.raises(ConfigError, match="round-indicators = True.*augment = 'crop-flip'.*allowed: round-indicators"):
        resolve_config({"evaluation": "federated", "client-evaluation": 0.2, "round-indicators": True,
                        "augment": "crop-flip", "dataset": "fashion-mnist"})
    assert resolve_config({"evaluation": "federated", "client-evaluation": 0.2})["evaluation"] == "federated"


def test_clients_per_round_sets_the_cohort_as_a_count_and_refuses_a_participation_beside_it():
    from strategies.cohort import cohort_size
    from strategies.general_keys import DEFAULT_PARTICIPATION

    assert default_run_config()["participation"] == DEFAULT_PARTICIPATION  # pyproject.toml's default
    assert cohort_size(resolve_config({"num-clients": 40, "clients-per-round": 3, "min-partition-size": 1})) == 3
    assert cohort_size(resolve_config({"num-clients": 10})) == 5  # participation 0.5
    with pytest.raises(ConfigError, match="'clients-per-round' = 10 and participation = 0.2 both set the cohort"):
        resolve_config({"num-clients": 40, "clients-per-round": 10, "participation": 0.2})
    with pytest.raises(ConfigError, match="'clients-per-round' = 11 exceeds num-clients = 10"):
        resolve_config({"num-clients": 10, "clients-per-round": 11})


def test_integers_are_accepted_for_float_keys():
    assert resolve_config({"lr": 1})["lr"] == 1.0


def test_overrides_parse_toml_values():
    assert parse_overrides(["lr=0.1", "dataset=digits", "partition='iid'", "num-rounds=3"]) == {
        "lr": 0.1, "dataset": "digits", "partition": "iid", "num-rounds": 3,
    }


def test_presets_are_valid():
    for name in ("ima-fmnist-shards", "ima-fmnist-dir0.1", "wima-fmnist-dir0", "wima-fmnist-dir0.05"):
        config = resolve_config(load_preset(name))
        assert config["num-clients"] == 100 and config["num-rounds"] == 300


def test_issue_4_presets_match_the_papers_setups():
    fedalign = resolve_config(load_preset("fedalign-cifar100"))
    assert (fedalign["model"], fedalign["alpha"], fedalign["num-clients"], fedalign["participation"]) == ("resnet56-bn", 0.5, 16, 1.0)
    assert (fedalign["local-epochs"], fedalign["num-rounds"], fedalign["fedalign-mu"], fedalign["fedalign-width"]) == (20, 25, 0.45, 0.25)
    assert (fedalign["nesterov"], fedalign["prox-mu"], fedalign["augment"]) == (True, 1e-4, "crop-flip")
    for alpha in (0.1, 0.3, 0.6):
        fedswa = resolve_config(load_preset(f"fedswa-cifar100-dir{alpha}"))
        assert (fedswa["dataset"], fedswa["model"], fedswa["alpha"]) == ("cifar100", "resnet18-bn", alpha)  # the authors' network
        assert (fedswa["num-clients"], fedswa["participation"], fedswa["local-epochs"], fedswa["batch-size"]) == (100, 0.1, 5, 50)
        assert (fedswa["num-rounds"], fedswa["augment"]) == (1000, "crop-flip")  # the paper's Table 3 horizon
    assert resolve_config(load_preset("fedswa-cifar100-dir0.1-short"))["num-rounds"] == 300
    for name in ("ima-fmnist-dir0.1", "ima-fmnist-shards"):  # the IMA authors' data pipeline
        ima = resolve_config(load_preset(name))
        assert (ima["normalize"], ima["dirichlet-balance"], ima["augment"]) == (False, True, "none")


@pytest.mark.parametrize("path", sorted(PRESETS_DIR.glob("*.toml")), ids=lambda p: p.stem)
def test_every_preset_resolves_and_its_partition_can_be_built(path):
    # resolve_config builds the partition on the data set's labels (synthetic class counts
    # where the data is not local) and raises ConfigError when it cannot be built.
    config = resolve_config(load_preset(path.stem))
    # Crop + flip on every CIFAR setup but IMA's (its authors' pipeline has no augmentation).
    cifar = config["dataset"].startswith("cifar") and not path.stem.startswith("ima-")
    assert config["augment"] == ("crop-flip" if cifar else "none")


def test_infeasible_partitions_are_refused_before_flower_starts_naming_the_setting():
    with pytest.raises(ConfigError, match=r"Dirichlet\(alpha=0.05\) over num-clients = 500 with min-partition-size = 10"):
        resolve_config({"num-clients": 500, "participation": 0.1, "alpha": 0.05})
    with pytest.raises(ConfigError, match="classes-per-client = 20 on digits, which has 10 classes"):
        resolve_config({"partition": "shards", "classes-per-client": 20})


@pytest.mark.parametrize("strategy", ["fedalign", "gradaug", "stochastic-depth"])
def test_residual_methods_refuse_models_without_slimmable_stages(strategy):
    with pytest.raises(ConfigError, match="'model' = 'auto'.*resnet20-gn"):
        resolve_config({"strategy": strategy})  # digits → the MLP
    assert resolve_config({"strategy": strategy, "model": "resnet20-gn"})["model"] == "resnet20-gn"


def test_launcher_refuses_bad_input_before_starting_flower():
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "experiments.run", "--set", "lr=-1"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert "'lr' = -1" in result.stderr and "allowed" in result.stderr
    assert "SuperLink" not in result.stdout + result.stderr
    assert time.monotonic() - started < 60


def test_compare_flags_make_a_grid():
    from experiments.run import label_of, variants

    grid = variants(["strategy=fedavg,fedadam", "averaging=none,ima"])
    assert grid == [
        {"strategy": "fedavg", "averaging": "none"}, {"strategy": "fedavg", "averaging": "ima"},
        {"strategy": "fedadam", "averaging": "none"}, {"strategy": "fedadam", "averaging": "ima"},
    ]
    assert label_of(grid[1]) == "fedavg-ima"
    with pytest.raises(ValueError, match="--compare"):
        variants(["averaging"])


def test_the_progress_bar_names_the_start_up_stage_from_flowers_log():
    from experiments.runtime.flower_log import startup_stage

    assert startup_stage("") == "starting Flower"
    log = "Starting local SuperLink on 127.0.0.1:1...\nSuccessfully started run 1\n"
    assert startup_stage(log) == "starting the simulation"
    log += "INFO : Starting Flower Simulation\n"
    assert startup_stage(log) == "starting Ray and the client processes"
    log += "[basin] loading digits and building its partition\n[basin] discovering clients: asking 4 nodes\n"
    assert startup_stage(log) == "discovering clients"


@pytest.mark.parametrize("module", ["run", "sweep", "sweep_report", "benchmark", "costs", "deploy"])
def test_help_answers_without_importing_torch_or_flower(module):
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['{module}', '--help']\n"
        "try:\n"
        f"    runpy.run_module('experiments.{module}', run_name='__main__')\n"
        "except SystemExit as exit:\n"
        "    assert exit.code in (0, None), exit.code\n"
        "print(sorted(m for m in ('torch', 'flwr', 'ray', 'pandas') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
    assert "'torch'" not in result.stdout and "'flwr'" not in result.stdout, result.stdout.splitlines()[-1]


def test_list_presets_and_keys_and_a_guess_for_a_mistyped_key(capsys):
    from experiments.run import main

    assert main(["--list-presets"]) == 0
    listed = capsys.readouterr().out
    assert all(path.stem in listed for path in PRESETS_DIR.glob("*.toml"))
    assert "(MNIST, MNIST-M, SVHN, SynthDigits, USPS).\n" in listed  # a whole first sentence, not cut
    assert main(["--list-keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(default_run_config())
    assert any(line.startswith("num-rounds") and "default 30" in line and "an integer from 1 to 1,000,000" in line for line in lines)
    with pytest.raises(ConfigError, match="'num-round' \\(did you mean 'num-rounds'\\?\\)"):
        resolve_config({"num-round": 3})


def test_the_output_folder_is_named_after_what_ran():
    from experiments.run import output_name

    assert output_name("ima-fmnist-shards", False, resolve_config({})) == "ima-fmnist-shards"
    assert output_name("ima-fmnist-dir0.1", False, resolve_config({})) == "ima-fmnist-dir0.1"  # not "…-dir0"
    assert output_name("my/setup.toml", False, resolve_config({})) == "setup"
    assert output_name(None, True, resolve_config({})) == "main"
    assert output_name(None, False, resolve_config({"strategy": "scaffold"})) == "scaffold"
    assert output_name(None, False, resolve_config({"averaging": "ima"})) == "fedavg+ima"
    # a comparison without a preset is named by what it compares, not by its first run
    assert output_name(None, False, resolve_config({}), ["strategy=fedavg,fedprox"]) == "compare-strategy"
    assert output_name(None, False, resolve_config({}), ["strategy=fedavg,fedprox", "seed=0,1"]) == "compare-strategy-seed"


def test_user_facing_docs_stand_alone():
    # README, presets and sweep files never send a user to files outside the repository.
    repo = PRESETS_DIR.parents[1]
    docs = [repo / "README.md", *PRESETS_DIR.glob("*.toml"), *(repo / "experiments" / "sweep_files").glob("*.toml")]
    for path in docs:
        text = path.read_text()
        assert "METHODS.md" not in text and "../shared" not in text and "BASELINES.md" not in text, path


def test_every_preset_says_in_its_listing_what_sets_it_apart():
    """`--list-presets` prints each preset's first sentence: no two may read the same."""
    from experiments.run import list_presets

    lines = list_presets().splitlines()
    descriptions = [line.split(maxsplit=1)[1] for line in lines[::2]]
    assert len(descriptions) == len(set(descriptions)), [d for d in descriptions if descriptions.count(d) > 1]
    # below each, its estimated wall time (experiments/reproduction/estimates.py), or why there is none
    assert all(line.startswith(" " * 33) and ("on 2 CPU cores" in line or "not estimated" in line) for line in lines[1::2])
    assert "≈ 17 min on 2 CPU cores; ≈ 44 s on one H100" in lines[lines.index(next(
        line for line in lines if line.startswith("ima-fmnist-shards "))) + 1]


@pytest.mark.parametrize("strategy", ["mime", "mimelite", "fedcm", "mofedsam", "fedacg", "adabest", "fedmoswa"])
def test_plain_sgd_methods_refuse_client_momentum(strategy):
    from experiments.runtime.run_config import resolve_config
    from strategies.config import ConfigError

    with pytest.raises(ConfigError, match="'momentum' = 0.9.*allowed: momentum = 0"):
        resolve_config({"strategy": strategy})
    resolve_config({"strategy": strategy, "momentum": 0.0})
