"""How ``experiments.run`` ends when its run does not complete: Ctrl-C (130 and the command
that resumes it) and a failed run (1 and its error in one line), with a fake launch (the
real runs: tests/test_sweep.py's interrupted sweep, tests/test_end_to_end.py's
nothing-trained run)."""

from __future__ import annotations

import shlex

from test_command_line_errors import SMALL


def test_ctrl_c_ends_the_job_with_130_and_the_command_that_resumes_it(tmp_path, monkeypatch, capsys):
    """run.main's side; launch's (processes stopped, summary.json ``interrupted``): the real
    sweep interrupted in tests/test_sweep.py, whose SIGTERM takes the same path."""
    from experiments import run
    from experiments.runtime import launch as launch_module

    def interrupted_launch(config, out_dir, *args, **kwargs):
        (out_dir / "results.csv").write_text("round\n1\n2\n3\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(launch_module, "launch", interrupted_launch)  # run.main imports it when called
    monkeypatch.chdir(tmp_path)
    assert run.main([*SMALL, "--set", "lr=0.1"]) == 130
    last = capsys.readouterr().err.splitlines()[-1]
    (folder,) = (tmp_path / "runs").iterdir()
    assert last.startswith("interrupted FedAvg after round 3; resume with: ")
    assert last.endswith(shlex.join(["-m", "experiments.run", *SMALL, "--set", "lr=0.1", "--out", str(folder)]))
    assert "Traceback" not in last


def test_a_failed_run_ends_the_command_with_1_and_its_error_in_one_line(tmp_path, monkeypatch, capsys):
    """run.main's side; launch's (the reason, from a real run whose every reply was NaN):
    tests/test_end_to_end.py's nothing-trained run."""
    from experiments import run
    from experiments.runtime import launch as launch_module
    from experiments.runtime.run_endings import RunFailed

    def failed_launch(config, out_dir, *args, **kwargs):
        raise RunFailed(f"run in {out_dir} failed: NothingTrained: no round trained the model\n(Flower's log: x)")

    monkeypatch.setattr(launch_module, "launch", failed_launch)  # run.main imports it when called
    assert run.main([*SMALL, "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    headline = next(line for line in err.splitlines() if line.startswith("error: run in"))
    assert headline == f"error: run in {tmp_path / 'out'} failed: NothingTrained: no round trained the model"
    assert "Traceback" not in err
