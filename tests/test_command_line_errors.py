"""Bad input and careless use: refused before any Flower process exists, in one line, with
exit code 2 and no traceback; one writer per output folder; Ctrl-C ends cleanly."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_idx, write_tiny_fashion_mnist
from miniature import damaged_hub_sets

from experiments.runtime.output_dir import LOCK_FILE, OutputLock, OutputLocked, unique_output_dir
from experiments.runtime.run_config import APP_DIR
from strategies.checkpoint import CHECKPOINT_ENTRIES, CHECKPOINT_FORMAT, save_checkpoint
from strategies.reply_screening import nothing_trained_reason

SMALL = ["--set", "num-rounds=2", "--set", "num-clients=4", "--set", "participation=1.0", "--set", "local-epochs=1"]
NO_GPU = not torch.cuda.is_available()

# (command, arguments, what the one-line message must name). "{tmp}" is the test's folder,
# where the fixture below leaves hostile files: a TOML syntax error, a corrupt and a
# foreign checkpoint, a truncated IDX file, a regular file where a folder should be.
CASES = [
    # a finished run's folder reused with another config: refused, naming the keys that differ
    ("run", [*SMALL, "--set", "lr=0.1", "--out", "{tmp}/finished"], "lr = 0.05 there but 0.1 now"),
    # combinations that cannot train, and values that would only run until killed
    ("run", [*SMALL, "--set", "model=char-lstm"], "'model' = 'char-lstm' predicts characters"),
    ("run", [*SMALL, "--set", "augment=crop-flip"], "'augment' = 'crop-flip' pads 4 pixels"),
    ("run", [*SMALL, "--set", "data-dir={tmp}"], "'data-dir'"),
    ("run", [*SMALL, "--set", "local-epochs=9223372036854775807"], "'local-epochs' = 9223372036854775807 is not allowed"),
    # a partition that leaves clients without samples (18 of 40 here): refused, not a hang
    ("run", [*SMALL, "--set", "num-clients=40", "--set", "alpha=0.01", "--set", "min-partition-size=0"],
     "clients would hold no samples"),
    # non-finite numbers, whatever key
    ("run", [*SMALL, "--set", "lr=inf"], "'lr' = inf"),
    ("run", [*SMALL, "--set", "lr=1e999"], "'lr' = inf"),
    ("run", [*SMALL, "--set", "lr=nan"], "'lr' = nan"),
    ("run", [*SMALL, "--set", "weight-decay=inf"], "'weight-decay'"),
    ("run", [*SMALL, "--set", "alpha=inf"], "'alpha'"),
    ("run", [*SMALL, "--set", "alpha=nan"], "'alpha'"),
    ("run", [*SMALL, "--set", "momentum=nan"], "'momentum'"),
    ("run", [*SMALL, "--set", "server-lr=inf"], "'server-lr'"),
    ("run", [*SMALL, "--set", "prox-mu=inf"], "'prox-mu'"),
    ("run", [*SMALL, "--set", "round-timeout=inf"], "'round-timeout'"),
    ("run", [*SMALL, "--set", "node-timeout=inf"], "'node-timeout'"),
    ("run", [*SMALL, "--set", "target-accuracy=nan"], "'target-accuracy'"),
    ("run", [*SMALL, "--set", "grad-clip=-inf"], "'grad-clip'"),
    ("run", [*SMALL, "--set", "avg-start=inf"], "'avg-start'"),
    # integers beyond Flower's int64, and wrong types
    ("run", [*SMALL, "--set", "num-rounds=99999999999999999999"], "'num-rounds'"),
    ("run", [*SMALL, "--set", "seed=9223372036854775808"], "'seed'"),
    ("run", [*SMALL, "--set", "num-clients=18446744073709551616"], "'num-clients'"),
    ("run", [*SMALL, "--set", "batch-size=1e3"], "'batch-size'"),
    ("run", [*SMALL, "--set", "local-epochs=two"], "'local-epochs'"),
    ("run", [*SMALL, "--set", "dirichlet-balance=yes"], "'dirichlet-balance'"),
    ("run", [*SMALL, "--set", "num-rounds=0"], "'num-rounds'"),
    ("run", [*SMALL, "--set", "seed=-1"], "'seed'"),
    ("run", [*SMALL, "--set", "participation=0"], "'participation'"),
    ("run", [*SMALL, "--set", "lr-decay=0"], "'lr-decay'"),
    ("run", [*SMALL, "--set", "fedswa-rho=2"], "'fedswa-rho'"),
    ("run", [*SMALL, "--set", "gma-threshold=0"], "'gma-threshold'"),
    ("run", [*SMALL, "--set", "node-timeout=0.001"], "'node-timeout'"),
    # keys that contradict each other, or the data
    ("run", [*SMALL, "--set", "partition=shards", "--set", "classes-per-client=20"], "classes-per-client"),
    ("run", [*SMALL, "--set", "averaging=ima", "--set", "window=10"], "'window' = 10"),
    ("run", [*SMALL, "--set", "averaging=wima", "--set", "window=3"], "'window' = 3"),
    ("run", [*SMALL, "--set", "avg-start=5"], "'avg-start'"),
    ("run", [*SMALL, "--set", "min-replies=5"], "'min-replies'"),
    ("run", [*SMALL, "--set", "fault-injection=nan:9"], "'fault-injection'"),
    ("run", [*SMALL, "--set", "fault-injection=boom:1"], "'fault-injection'"),
    ("run", [*SMALL, "--set", "strategy=fedalign"], "'model'"),
    ("run", [*SMALL, "--set", "model=fmnist-cnn"], "'model'"),
    ("run", [*SMALL, "--set", "nesterov=true", "--set", "momentum=0"], "'nesterov'"),
    ("run", [*SMALL, "--set", "num-clients=500", "--set", "participation=0.01"], "num-clients = 500"),
    ("run", [*SMALL, "--set", "min-partition-size=1000"], "min-partition-size = 1000"),
    ("run", [*SMALL, "--set", "output-dir={tmp}/a", "--out", "{tmp}/b"], "'output-dir'"),
    ("run", [*SMALL, "--set", "output-dir={tmp}/file"], "'output-dir'"),
    # the command line itself
    ("run", [*SMALL, "--set", "lr"], "'lr'"),
    ("run", [*SMALL, "--set", "=0.1"], "unknown run config key"),
    ("run", [*SMALL, "--set", "num-round=3"], "did you mean 'num-rounds'"),
    ("run", [*SMALL, "--set", "strategy=fedprx"], "'strategy' = 'fedprx' is not allowed (did you mean 'fedprox'?)"),
    ("run", ["--preset", "ima-fmnist-shard"], "preset 'ima-fmnist-shard' not found (did you mean 'ima-fmnist-shards'?)"),
    ("run", [*SMALL, "--compare", "averaging"], "--compare 'averaging'"),
    ("run", [*SMALL, "--compare", "lr=0.1,inf"], "'lr' = inf"),
    ("run", [*SMALL, "--compare", "averaging=none,ima", "--set", "window=10"], "'window' = 10"),
    ("run", [*SMALL, "--cpus-per-client", "0.5"], "num-cpus per client = 0.5"),
    ("run", [*SMALL, "--cpus-per-client", "4096"], "4096"),
    ("run", [*SMALL, "--cpus-per-client", "inf"], "num-cpus per client = inf"),
    ("run", [*SMALL, "--cpus-per-client", "nan"], "num-cpus per client = nan"),
    ("run", [*SMALL, "--out", ""], "argument --out: an empty path"),
    ("run", [*SMALL, "--gpus-per-client", "2"], "num-gpus per client = 2"),
    ("run", [*SMALL, "--gpus-per-client", "lots"], "'lots' is not allowed; allowed: a number in [0, 1] or 'auto'"),
    ("sweep", ["no-such-sweep", "--parallel", "0"], "'0' is not allowed; allowed: an integer >= 1 or 'auto'"),
    ("run", [*SMALL, "--ray-address", "nowhere"], "'nowhere'"),
    ("run", [*SMALL, "--ray-address", "ray://host:10001"], "ray://host:10001"),
    ("run", [*SMALL, "--ray-address", "127.0.0.1:1"], "127.0.0.1:1"),
    # presets
    ("run", ["--preset", "{tmp}/bad.toml"], "{tmp}/bad.toml"),
    ("run", ["--preset", "no-such-preset"], "'no-such-preset'"),
    ("run", ["--preset", "{tmp}/unknown-key.toml"], "'learning-rate'"),
    # data: damaged Fashion-MNIST files, each named with what is wrong, before the partition reads them
    *[("run", [*SMALL, "--set", "dataset=fashion-mnist", "--set", f"data-dir={{tmp}}/{name}"], f"{{tmp}}/{name}/{file} {what}")
      for name, file, what in [
          ("zero-gz", "train-labels-idx1-ubyte.gz", "is empty"),
          ("not-gzip", "train-labels-idx1-ubyte.gz", "is not gzip data"),
          ("bad-magic", "train-labels-idx1-ubyte.gz", "is not an unsigned-byte IDX file"),
          ("trailing", "t10k-images-idx3-ubyte.gz", "has 7 bytes after the 7840 values"),
          ("label-outside", "t10k-labels-idx1-ubyte.gz", "holds label 12, outside the 10 classes"),
          ("wrong-dims", "train-images-idx3-ubyte.gz", "holds images of 27×27, not 28×28"),
      ]],
    ("run", [*SMALL, "--set", "dataset=fashion-mnist", "--set", "data-dir={tmp}/short-images"], "19 images but 20 labels"),
    # damaged hub sets (local copies): named, with what is wrong, before Flower starts
    ("run", [*SMALL, "--set", "dataset=hf:{tmp}/hub/no-train"], "hub data set '{tmp}/hub/no-train' cannot be used"),
    ("run", [*SMALL, "--set", "dataset=hf:{tmp}/hub/string-labels"], "needs an Image and a ClassLabel column"),
    ("run", [*SMALL, "--set", "dataset=hf:{tmp}/hub/empty-test"], "hub data set '{tmp}/hub/empty-test' cannot be used"),
    ("run", [*SMALL, "--set", "dataset=fashion-mnist", "--set", "data-dir={tmp}/short-labels"], "20 images but 12 labels"),
    # data: missing, truncated, unreachable
    ("run", [*SMALL, "--set", "dataset=fashion-mnist", "--set", "data-dir={tmp}/nowhere"], "{tmp}/nowhere"),
    ("run", [*SMALL, "--set", "dataset=fashion-mnist", "--set", "data-dir={tmp}/truncated", "--set", "min-partition-size=1"],
     "{tmp}/truncated/train-images-idx3-ubyte.gz is truncated"),
    ("run", [*SMALL, "--set", "dataset=hf:basin-tests/no-such-set"], "'basin-tests/no-such-set'"),
    ("run", [*SMALL, "--set", "dataset=cifar10"], "'dataset' = 'cifar10'"),
    ("run", [*SMALL, "--set", "dataset=mnist"], "'dataset'"),
    # output folders
    ("run", [*SMALL, "--out", "/proc/basin-out"], "/proc/basin-out"),
    ("run", [*SMALL, "--out", "{tmp}/file"], "{tmp}/file"),
    ("run", [*SMALL, "--out", "{tmp}/file/inside"], "{tmp}/file/inside"),
    ("run", [*SMALL, "--out", "{tmp}/" + "x" * 300], "File name too long"),
    ("run", [*SMALL, "--out", "{tmp}/corrupt"], "{tmp}/corrupt/checkpoint.pt"),
    ("run", [*SMALL, "--out", "{tmp}/foreign"], "num-rounds = 7 there but 2 here"),
    ("run", [*SMALL, "--out", "{tmp}/locked"], "PID"),
    # sweeps
    ("sweep", ["no-such-sweep"], "'no-such-sweep'"),
    ("sweep", ["{tmp}/bad.toml"], "{tmp}/bad.toml"),
    ("sweep", ["{tmp}/sweep-output-dir.toml"], "output-dir"),
    ("sweep", ["{tmp}/sweep-unknown.toml"], "colour"),
    *[("sweep", [f"{{tmp}}/sweep-{name}.toml"], f"sweep-{name}.toml: {field}") for name, field in [
        ("resources-5", "resources = 5 is not allowed"), ("set-5", "set = 5 is not allowed"),
        ("preset-5", "preset = 5 is not allowed"), ("name-5", "name = 5 is not allowed"),
        ("name-slash", "name = '/' is not allowed"), ("name-up", "name = '../../x' is not allowed"),
        ("grid-5", "grid = 5 is not allowed"), ("gpus-half", "[resources] num-gpus = 'half' is not allowed"),
        ("set-list", "[set] lr = [0.1, 0.2] is not allowed"),
    ]],
    ("sweep", ["{tmp}/sweep-inf.toml"], "'lr' = inf"),
    ("sweep", ["{tmp}/sweep-empty-grid.toml"], "[grid]"),
    ("sweep", ["{tmp}/sweep.toml", "--set", "lr=nan"], "'lr' = nan"),
    ("sweep", ["{tmp}/sweep-cpus.toml", "--out", "{tmp}/s"], "4096"),
    ("sweep", ["{tmp}/sweep.toml", "--out", "{tmp}/file"], "{tmp}/file"),
    ("sweep", ["{tmp}/sweep.toml", "--out", "{tmp}/locked"], "PID"),
    ("sweep", ["{tmp}/sweep.toml", "--ray-address", "127.0.0.1:1"], "127.0.0.1:1"),
    # a deployment
    ("deploy", [*SMALL, "--set", "lr=inf"], "'lr' = inf"),
    ("deploy", ["--preset", "{tmp}/bad.toml"], "{tmp}/bad.toml"),
    ("deploy", [*SMALL, "--out", "{tmp}/file"], "{tmp}/file"),
    ("deploy", [*SMALL, "--out", "{tmp}/corrupt"], "{tmp}/corrupt/checkpoint.pt"),
    ("deploy", [*SMALL, "--out", "{tmp}/locked"], "PID"),
    ("deploy", [*SMALL, "--cpus-per-client", "0"], "num-cpus per client = 0"),
    # the benchmark and the cost table
    ("benchmark", ["--preset", "none", "--rounds", "0"], "--rounds"),
    ("benchmark", ["--preset", "none", "--set", "lr=inf"], "'lr' = inf"),
    ("benchmark", ["--preset", "{tmp}/bad.toml"], "{tmp}/bad.toml"),
    ("benchmark", ["--preset", "none", "--rounds", "2", "--out", "{tmp}/file"], "{tmp}/file"),
    ("benchmark", ["--preset", "none", "--rounds", "2", "--cpus-per-client", "4096"], "4096"),
    ("benchmark", ["--preset", "none", "--set", "strategy=fedprox"], "'fedprox'"),
    ("costs", ["--model", "resnet-9000"], "--model"),
    ("costs", ["--steps", "0"], "--steps"),
    ("costs", ["--input-shape", "3x"], "--input-shape"),
    ("costs", ["--set", "lr=inf"], "'lr' = inf"),
    ("costs", ["--device", "tpu"], "--device"),
    ("costs", ["--methods", "fedavg,fedsomething"], "fedsomething"),
    ("costs", ["--steps", "1", "--out", "{tmp}/file/table.csv"], "{tmp}/file"),
    # a sweep's report
    ("sweep_report", ["{tmp}/nowhere"], "{tmp}/nowhere"),
    ("sweep_report", ["{tmp}/s-empty"], "results.parquet"),
    ("sweep_report", ["{tmp}/finished"], "holds one run's per-round results, not a sweep's"),
    ("run", ["--preset", "{tmp}/binary.toml"], "{tmp}/binary.toml is not UTF-8 text"),
    ("analysis.__main__", ["landscape", "{tmp}/nowhere", "--stages", "a,b"], "--stages: 'a,b' is not allowed"),
    ("analysis.__main__", ["interpolate", "{tmp}/nowhere", "--alphas=0,1,0"], "--alphas '0,1,0' is not allowed"),
    ("analysis.__main__", ["stability", "{tmp}/nowhere", "--out", "{tmp}/file"], "--out {tmp}/file: a file is in the way"),
]
if NO_GPU:
    CASES += [
        ("run", [*SMALL, "--set", "device=cuda"], "'device' = 'cuda'"),
        ("run", [*SMALL, "--gpus-per-client", "0.5"], "GPUs per client = 0.5"),
        ("deploy", [*SMALL, "--set", "device=cuda"], "'device' = 'cuda'"),
        ("costs", ["--device", "cuda"], "'cuda'"),
        ("run", [*SMALL, "--mps"], "--mps needs a CUDA GPU"),
        ("benchmark", ["--preset", "none", "--rounds", "1", "--mps", "--out", "{tmp}/b-mps"], "--mps needs a CUDA GPU"),
    ]

SWEEP_RUN = "[set]\nnum-clients = 4\nparticipation = 1.0\nnum-rounds = 2\n"


class FlowerStarted(BaseException):
    """Raised instead of starting a process: a refused input must never get that far."""


@pytest.fixture(scope="module")
def hostile_files(tmp_path_factory) -> Path:
    from experiments.runtime.run_config import default_run_config
    from strategies.checkpoint import run_identity

    tmp = tmp_path_factory.mktemp("hostile")
    (tmp / "bad.toml").write_text("lr = [0.1\n")
    (tmp / "binary.toml").write_bytes(bytes(range(128, 256)))
    (tmp / "unknown-key.toml").write_text("learning-rate = 0.1\n")
    (tmp / "file").write_text("a regular file\n")
    (tmp / "corrupt").mkdir()
    (tmp / "corrupt" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    (tmp / "foreign").mkdir()
    other = {**default_run_config(), "num-clients": 4, "participation": 1.0, "local-epochs": 1, "num-rounds": 7}
    save_checkpoint(tmp / "foreign" / "checkpoint.pt", {
        **{entry: [] for entry in CHECKPOINT_ENTRIES}, "format": CHECKPOINT_FORMAT, "config": run_identity(other),
        "round": 1,
    })
    (tmp / "finished").mkdir()  # a finished run's folder (its results and run config), lr = 0.05
    finished = {**default_run_config(), "num-clients": 4, "participation": 1.0, "local-epochs": 1, "num-rounds": 2}
    (tmp / "finished" / "run-config.toml").write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in finished.items()))
    (tmp / "finished" / "results.csv").write_text("round,test-accuracy\n1,0.5\n2,0.6\n")
    damaged = {  # Fashion-MNIST copies with one damaged file each
        "zero-gz": lambda d: (d / "train-labels-idx1-ubyte.gz").write_bytes(b""),
        "not-gzip": lambda d: (d / "train-labels-idx1-ubyte.gz").write_bytes(b"\x00\x00\x08\x01plain bytes"),
        "bad-magic": lambda d: write_idx(d / "train-labels-idx1-ubyte.gz", np.arange(20) % 10, magic=b"\x00\x00\x0d\x01"),
        "trailing": lambda d: write_idx(d / "t10k-images-idx3-ubyte.gz", np.zeros((10, 28, 28)), extra=b"\x00" * 7),
        "short-images": lambda d: write_idx(d / "train-images-idx3-ubyte.gz", np.zeros((19, 28, 28))),
        "short-labels": lambda d: write_idx(d / "train-labels-idx1-ubyte.gz", np.arange(12) % 10),
        "label-outside": lambda d: write_idx(d / "t10k-labels-idx1-ubyte.gz", np.arange(10) + 3),
        "wrong-dims": lambda d: write_idx(d / "train-images-idx3-ubyte.gz", np.zeros((20, 27, 27))),
    }
    for name, damage in damaged.items():
        damage(write_tiny_fashion_mnist(tmp / name))
    damaged_hub_sets(tmp / "hub")
    images = write_tiny_fashion_mnist(tmp / "truncated") / "train-images-idx3-ubyte.gz"
    images.write_bytes(images.read_bytes()[:-40])
    (tmp / "locked").mkdir()
    holder = subprocess.Popen(  # another launcher holding a folder
        [sys.executable, "-c", "import sys, time; from experiments.runtime.output_dir import OutputLock; "
         "lock = OutputLock(sys.argv[1]).__enter__(); print('held', flush=True); time.sleep(900)", str(tmp / "locked")],
        cwd=APP_DIR, stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    (tmp / "s-empty").mkdir()
    (tmp / "sweep.toml").write_text(SWEEP_RUN + "[grid]\nseed = [0, 1]\n")
    (tmp / "sweep-output-dir.toml").write_text(SWEEP_RUN + f'output-dir = "{tmp}/o"\n[grid]\nseed = [0, 1]\n')
    (tmp / "sweep-unknown.toml").write_text("colour = 'red'\n" + SWEEP_RUN + "[grid]\nseed = [0]\n")
    for name, text in {  # every field of the wrong type, and names that are not names
        "resources-5": "resources = 5\n" + SWEEP_RUN, "set-5": "set = 5\n", "preset-5": "preset = 5\n" + SWEEP_RUN,
        "name-5": "name = 5\n" + SWEEP_RUN, "name-slash": 'name = "/"\n' + SWEEP_RUN,
        "name-up": 'name = "../../x"\n' + SWEEP_RUN, "grid-5": SWEEP_RUN.replace("[set]", "grid = 5\n[set]"),
        "gpus-half": SWEEP_RUN + '[resources]\nnum-gpus = "half"\n', "set-list": SWEEP_RUN + "lr = [0.1, 0.2]\n",
    }.items():
        (tmp / f"sweep-{name}.toml").write_text(text + ("" if "grid = 5" in text else "[grid]\nseed = [0]\n"))
    (tmp / "sweep-inf.toml").write_text(SWEEP_RUN + "[grid]\nlr = [0.1, inf]\n")
    (tmp / "sweep-empty-grid.toml").write_text(SWEEP_RUN + "[grid]\n")
    (tmp / "sweep-cpus.toml").write_text(SWEEP_RUN + "[resources]\nnum-cpus = 4096\n[grid]\nseed = [0]\n")
    yield tmp
    holder.kill()
    holder.wait()


@pytest.fixture
def no_processes(monkeypatch):
    """Any attempt to start a process (Flower, a SuperLink, Ray) raises FlowerStarted."""
    def refuse(*args, **kwargs):
        raise FlowerStarted(f"a process was started: {args[0] if args else kwargs}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub check answers at once, as offline


@pytest.mark.parametrize("command, arguments, named", CASES, ids=[f"{c}-{i}" for i, (c, *_) in enumerate(CASES)])
def test_bad_input_is_one_line_exit_2_before_any_process(command, arguments, named, hostile_files, no_processes,
                                                          monkeypatch, capsys):
    monkeypatch.chdir(hostile_files)  # a default output folder would appear here
    tmp = str(hostile_files)
    argv = [a.replace("{tmp}", tmp) for a in arguments]
    module = importlib.import_module(f"experiments.{command}")
    try:
        code = module.main(argv)
    except SystemExit as exit:  # argparse's own refusals: "usage: …" then "<prog>: error: …"
        code = exit.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert named.replace("{tmp}", tmp) in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert (lines[-1].startswith("error: ") or ": error: " in lines[-1]) and "Traceback" not in err
    assert not (hostile_files / "runs").exists()


def test_the_table_has_at_least_80_cases():
    assert len(CASES) >= 80


def test_each_command_exits_2_without_a_traceback_as_a_module(tmp_path):
    """The same through each module's ``__main__`` path (run as ``python -m``), in one process."""
    commands = {
        "run": ["--set", "lr=inf"], "sweep": [str(tmp_path / "nowhere.toml")], "deploy": ["--set", "seed=-1"],
        "benchmark": ["--rounds", "0"], "costs": ["--steps", "0"], "sweep_report": [str(tmp_path)],
    }
    code = (
        "import contextlib, io, json, runpy, sys, traceback\n"
        "results = {}\n"
        "for name, args in json.loads(sys.argv[1]).items():\n"
        "    sys.argv, err = [name, *args], io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        try:\n"
        "            runpy.run_module(f'experiments.{name}', run_name='__main__')\n"
        "            status = 0\n"
        "        except SystemExit as exit:\n"
        "            status = exit.code\n"
        "        except BaseException:\n"
        "            status, _ = 'raised', traceback.print_exc()\n"
        "    results[name] = [status, err.getvalue()]\n"
        "print(json.dumps(results))\n"
    )
    result = subprocess.run([sys.executable, "-c", code, json.dumps(commands)], cwd=APP_DIR, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    for name, (status, err) in json.loads(result.stdout.splitlines()[-1]).items():
        assert status == 2, (name, err)
        assert err.startswith("error: ") and "Traceback" not in err and len(err.strip().splitlines()) == 1, (name, err)


def test_a_second_writer_is_refused_naming_the_holder_and_a_dead_holders_lock_is_taken_over(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from experiments.runtime.output_dir import OutputLock; "
         "lock = OutputLock(sys.argv[1]).__enter__(); print('held', flush=True); time.sleep(600)", str(tmp_path)],
        cwd=APP_DIR, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        (tmp_path / "summary.json").write_text(json.dumps({"status": "running", "rounds": 3}))
        with pytest.raises(OutputLocked, match=f"PID {holder.pid}"):
            OutputLock(tmp_path).__enter__()
    finally:
        holder.kill()
        holder.wait()
    with OutputLock(tmp_path):  # the dead holder's lock file is still there: taken over
        assert (tmp_path / LOCK_FILE).read_text().strip() == str(os.getpid())
        with OutputLock(tmp_path):  # the holder may lock again (a run's folder inside its job's)
            pass
        summary = json.loads((tmp_path / "summary.json").read_text())
        assert summary["status"] == "killed" and f"PID {holder.pid}" in summary["error"] and summary["rounds"] == 3


def test_default_output_folders_of_launches_in_the_same_second_differ(tmp_path):
    folders = [unique_output_dir(tmp_path, "main") for _ in range(3)]
    assert len(set(folders)) == 3 and all(folder.is_dir() for folder in folders)
    assert folders[1].name == folders[0].name + "-2"


def test_nothing_trained_names_the_first_failures_and_a_hint():
    config = {"lr": 1e30, "round-timeout": 600.0, "min-replies": 1}
    skipped = {"round-status": "skipped: 0 accepted replies, fewer than min-replies = 1"}
    rows = [{**skipped, "round": 1, "failures": "partition 0 (node 7): non-finite values (NaN or inf) in arrays['w']"},
            {**skipped, "round": 2, "failures": "partition 1 (node 8): non-finite values (NaN or inf) in arrays['w']"}]
    reason = nothing_trained_reason(rows, config)
    assert reason.startswith("no round trained the model: all client replies were non-finite in every round from round 1 on")
    assert "partition 0 (node 7)" in reason and reason.endswith("is lr = 1e+30 too large?")
    timeouts = [{**skipped, "round": 1, "failures": "partition 0 (node 7): no reply within round-timeout"}]
    assert nothing_trained_reason(timeouts, config).endswith("raise round-timeout (= 600.0 s)")
    assert nothing_trained_reason([*rows, {"round": 3, "round-status": "aggregated"}], config) is None
    assert nothing_trained_reason([], config) is None
