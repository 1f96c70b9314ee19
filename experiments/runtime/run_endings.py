"""How a run in a folder ended, for the launcher, the sweeps and the Deployment Engine: the
failure to raise, the summary of a run that did not complete; and whether a folder's earlier
run may go on there (the same config) or is another run's."""

from __future__ import annotations

import csv
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments.runtime.cli import NO_SPACE, DiskFull
from experiments.runtime.flower_log import count_rounds, flower_failure_reason, read_summary
from experiments.runtime.output_dir import FolderHoldsAnotherRun, clear_folder
from strategies.checkpoint import run_identity
from strategies.config import summary_horizon
from strategies.results import current_summary, summarize, write_json_atomic


class RunFailed(RuntimeError):
    """A Flower run ended without a completed summary."""

    # What finished before the failure, where the caller has it: the Python API's Job,
    # SweepResult or Reproduction (experiments/api.py); None from a single launch.
    job: object | None = None


def check_folder_reuse(out_dir: Path, config: Mapping[str, Any], overwrite: bool = False) -> None:
    """Refuse an output directory that holds results of a run with another config
    (FolderHoldsAnotherRun names the keys that differ); with ``overwrite`` its contents are
    removed instead. The same config may come back: it resumes, or runs again."""
    previous_path = Path(out_dir) / "run-config.toml"
    if not (Path(out_dir) / "results.csv").exists() or not previous_path.exists():
        return
    try:
        previous = run_identity(tomllib.loads(previous_path.read_text()))
    except (OSError, tomllib.TOMLDecodeError):
        previous = {}
    current = run_identity({**config, "output-dir": str(out_dir)})
    differing = sorted(key for key in set(previous) | set(current) if previous.get(key) != current.get(key))
    if not differing:
        return
    if overwrite:
        clear_folder(out_dir)
        return
    shown = ", ".join(f"{key} = {previous.get(key)!r} there but {current.get(key)!r} now" for key in differing[:6])
    more = f" and {len(differing) - 6} more" if len(differing) > 6 else ""
    raise FolderHoldsAnotherRun(
        f"output directory {out_dir} holds the results of a run with another config ({shown}{more}); "
        f"allowed: the same config (it resumes or runs again), another --out, or --overwrite to replace them"
    )


def run_failure(out_dir: Path, config: Mapping[str, Any], log_path: Path, context: str = "") -> RunFailed | DiskFull:
    """Why a Flower run in ``out_dir`` did not complete, as the RunFailed to raise (DiskFull
    when a write failed for a full disk: the summary then says ``failed`` with that reason).

    The ServerApp's recorded error when there is one (Flower's log, with its traceback, is
    named, not shown); else Flower or its processes died before the ServerApp recorded an
    end: summary.json is marked ``killed``, and the reason is the last error in Flower's
    log, or what is known, followed by the log's last lines. ``context`` adds what the
    caller saw (e.g. a SuperLink's exit).
    """
    summary = read_summary(out_dir)
    log_text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    if _disk_was_full(summary, log_text):
        reason = f"the disk holding the output folder is full ({NO_SPACE})"
        try:  # the run's temporary files are removed: a summary is small enough to fit, mostly
            end_summary(out_dir, config, "failed", reason)
        except OSError:
            pass  # it then still says "running"; the next launcher in the folder marks it killed
        return DiskFull(out_dir, NO_SPACE)
    if summary is not None and summary.get("status") == "failed":
        return RunFailed(f"run in {out_dir} failed: {summary.get('error')}{context}\n(Flower's log: {log_path})")
    reason = flower_failure_reason(log_text) or (
        f"the ServerApp's process ended after round {count_rounds(out_dir)} without recording why "
        f"(killed from outside, or out of memory?)"
    )
    end_summary(out_dir, config, "killed", reason)
    tail = "\n".join(log_text.splitlines()[-30:])
    return RunFailed(f"run in {out_dir} failed: {reason}{context}\n--- last lines of {log_path} ---\n{tail}")


def _disk_was_full(summary: Mapping[str, Any] | None, log_text: str) -> bool:
    """Whether the ServerApp failed writing to a full disk: its recorded error, or Flower's
    log when it could not record one (the summary itself did not fit)."""
    marker = "[Errno 28]"
    return marker in str((summary or {}).get("error", "")) or (
        (summary is None or summary.get("status") == "running") and marker in log_text)


def interrupted_reason(out_dir: Path, config: Mapping[str, Any]) -> str:
    """What an interrupted run's summary says: where it stopped, and how to go on."""
    return (f"interrupted at round {count_rounds(out_dir)} of {config['num-rounds']} (Ctrl-C or SIGTERM): "
            "run the same command again to resume")


def end_summary(out_dir: Path, config: Mapping[str, Any], status: str, reason: str) -> None:
    """Record in ``summary.json`` how a run that did not complete ended (``interrupted``,
    ``killed``), with the metrics of the rounds it finished; a completed run's is left alone."""
    summary = read_summary(out_dir) or {}
    if summary.get("status") == "completed":
        return
    try:
        with open(out_dir / "results.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        rows = []
    metrics = summarize(rows, summary_horizon(config), config["target-accuracy"])
    write_json_atomic(out_dir / "summary.json", {**current_summary(summary), **metrics, "status": status, "error": reason})
