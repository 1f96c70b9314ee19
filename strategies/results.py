"""What a run writes to its output directory, incrementally so a dying run loses nothing.

- ``config.json``: the resolved run config (written first).
- ``results.csv``: one row per round, appended and flushed as each round ends.
- ``summary.json``: status (``running`` → ``completed`` | ``failed`` with the error),
  last-k mean accuracy, best accuracy, first round reaching the target; replaced
  atomically.
- ``final_model.pt``: the final global model's state dict (``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clients.atomic_files import write_atomically

if TYPE_CHECKING:
    from strategies.tracking import Trackers

# test-accuracy/-loss: the model the method reports (IMA: the one clients receive;
# WIMA/SWA: the averaged shadow once it exists); base-*: the base method's model;
# averaged-*: the window average (empty before it exists); sent-model: what clients
# receive next round ("base" or "averaged"); client-state-norm: mean norm of the state a
# stateful client (SCAFFOLD's c_i) brought into the round, empty for stateless methods;
# round-seconds = train-seconds (send, client work, aggregate) + eval-seconds (central
# test); client-steps: local steps of the whole cohort; client-seconds: time some client of the cohort was computing; client-gpu-mib:
# largest peak CUDA memory of a client process (empty on CPU); round-status: "aggregated" or
# why the round was skipped (too few accepted replies: the global model stays as it was);
# failures: each failed client of the round, "partition P (node N): reason", ";"-separated;
# bytes-sent, bytes-received: the arrays of the round's messages to and from clients, totals
# over the cohort on the server's side; -per-client: over its sampled clients;
# client-accuracy-mean/-worst-10pct/-std: with client-evaluation > 0, the received model on
# each sampled client's held-out split, across the cohort (else empty);
# dp-epsilon: with server-side DP, the ε spent after the round at δ = dp-delta where an
# accountant applies (summary.json's "privacy" says which, or why none; else empty);
# locality, locality-mean, client-cka: IMA's indicators of the cohort's models
# (strategies/indicators.py), with round-indicators = true (else empty). A data set with
# domains adds domain-mean-accuracy and accuracy-<domain> (the reported model on each
# domain's test split; IMA's feature-skew number is the mean over domains).
ROUND_COLUMNS = (
    "round", "lr", "local-epochs", "test-accuracy", "test-loss",
    "base-accuracy", "base-loss", "averaged-accuracy", "averaged-loss", "sent-model",
    "train-loss", "clients-ok", "clients-failed", "local-steps", "client-state-norm", "round-seconds",
    "client-steps", "train-seconds", "eval-seconds", "client-seconds", "client-gpu-mib", "bytes-sent", "bytes-received",
    "bytes-sent-per-client", "bytes-received-per-client",
    "client-accuracy-mean", "client-accuracy-worst-10pct", "client-accuracy-std", "round-status", "failures",
    "locality", "locality-mean", "client-cka", "dp-epsilon",
)


def write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    """Write JSON atomically (:func:`clients.state_store.write_atomically`: never half-written,
    no temporary file left when the disk is full)."""
    write_atomically(path, json.dumps(payload, indent=2, sort_keys=True).encode())


# Summary keys of earlier Basin releases → today's names (run folders written before keep working).
# results.csv columns of older runs under today's names (MiB, 2²⁰ bytes, not MB).
RENAMED_ROUND_COLUMNS = {"client-gpu-mb": "client-gpu-mib"}
RENAMED_SUMMARY_KEYS = {"best-accuracy": "acc-best", "final-accuracy": "acc-final",
                        "round-reaching-target": "rounds-to-target"}


def current_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A summary.json's content under today's names: an older run's ``last-K-accuracy``,
    ``best-accuracy``, ``final-accuracy`` and ``round-reaching-target`` read as
    ``acc-last-k``, ``acc-best``, ``acc-final`` and ``rounds-to-target``."""
    current = {RENAMED_SUMMARY_KEYS.get(key, key): value for key, value in summary.items()}
    old_last_k = f"last-{summary.get('last-k')}-accuracy"
    if "acc-last-k" not in current and old_last_k in current:
        current["acc-last-k"] = current.pop(old_last_k)
    return current


def summarize(rows: Sequence[Mapping[str, Any]], last_k: int, target: float) -> dict[str, Any]:
    """Summary metrics of per-round rows (uses ``test-accuracy``; accuracies are fractions in
    [0, 1], as in results.csv)."""
    accuracies = [float(r["test-accuracy"]) for r in rows]
    if not accuracies:
        return {"rounds": 0}
    # A run shorter than k rounds averages all of them, and says so.
    requested, last_k = last_k, min(last_k, len(accuracies))
    tail = accuracies[-last_k:]
    best = max(range(len(accuracies)), key=accuracies.__getitem__)
    reached = next((int(r["round"]) for r in rows if float(r["test-accuracy"]) >= target), None)
    return {
        "rounds": len(rows),
        "acc-last-k": sum(tail) / len(tail),
        "last-k": last_k,
        **({"last-k-requested": requested} if requested != last_k else {}),
        "acc-best": accuracies[best],
        "best-round": int(rows[best]["round"]),
        "acc-final": accuracies[-1],
        "target-accuracy": target,
        "rounds-to-target": reached,
        "rounds-skipped": sum(str(r.get("round-status", "")).startswith("skipped") for r in rows),
        "client-failures": int(sum(v for r in rows if not math.isnan(v := float(r.get("clients-failed", 0))))),
        # the run's traffic: every round's arrays to and from clients (a resumed run: its rows')
        "bytes-sent": int(sum(v for r in rows if not math.isnan(v := float(r.get("bytes-sent", 0))))),
        "bytes-received": int(sum(v for r in rows if not math.isnan(v := float(r.get("bytes-received", 0))))),
        # with server-side DP: the ε spent after the last round (NaN where no accountant applies)
        **({"dp-epsilon": float(rows[-1]["dp-epsilon"])} if "dp-epsilon" in rows[-1] else {}),
        # with the simulated clock: the run's simulated seconds, and those until target-accuracy was reached
        **({"simulated-time": float(rows[-1]["simulated-time"]),
            "time-to-target": next((float(r["simulated-time"]) for r in rows if int(r["round"]) == reached), None)}
           if "simulated-time" in rows[-1] else {}),
    }


# With client-evaluation > 0: one row per accepted client and round, the received model on
# that client's held-out split (accuracy a fraction, loss the mean cross-entropy).
CLIENT_EVALUATION_FILE = "client-evaluation.csv"
CLIENT_EVALUATION_COLUMNS = ("round", "partition", "node", "examples", "accuracy", "loss")


def client_accuracy_summary(server_round: int, accuracies: Sequence[float]) -> dict[str, Any]:
    """summary.json's ``client-accuracy``: a round's clients' accuracies, their mean, the mean
    of the worst 10 % (at least one), the 10th, 50th and 90th percentiles (linear
    interpolation) and the standard deviation over clients (ddof 0)."""
    ordered = sorted(float(a) for a in accuracies)
    mean = sum(ordered) / len(ordered)
    worst = ordered[:max(1, math.ceil(0.1 * len(ordered)))]

    def percentile(q: float) -> float:  # numpy's default (linear) rule
        at = q / 100 * (len(ordered) - 1)
        low = math.floor(at)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (at - low)

    return {"round": server_round, "clients": len(ordered), "mean": mean, "worst-10pct": sum(worst) / len(worst),
            "p10": percentile(10), "p50": percentile(50), "p90": percentile(90),
            "std": math.sqrt(sum((a - mean) ** 2 for a in ordered) / len(ordered))}


class RunRecorder:
    """Writes a run's config, per-round rows and summary into ``directory``.

    A resumed run passes the rows its checkpoint holds; ``results.csv`` is rewritten with
    them, dropping rows of rounds run after that checkpoint (they will be run again).
    """

    def __init__(
        self, directory: Path, config: Mapping[str, Any], last_k: int, target: float,
        rows: Sequence[Mapping[str, Any]] = (), resumed_after: int | None = None, trackers: Trackers | None = None,
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.last_k, self.target = last_k, target
        self.resumed_after = resumed_after
        self.rows: list[dict[str, Any]] = []
        self.columns: tuple[str, ...] = ROUND_COLUMNS
        self.started = time.time()
        self.training_started: float | None = None
        self.described: dict[str, Any] = {}
        self.trackers = trackers
        self.tracked_rounds: set[Any] = set()
        write_json_atomic(self.directory / "config.json", dict(config))
        self.results_path = self.directory / "results.csv"
        self._given_rows = list(rows)
        self._write_rows()
        self.clients_path = self.directory / CLIENT_EVALUATION_FILE if config.get("client-evaluation") else None
        if self.clients_path is not None:
            self._keep_client_rows_until(resumed_after or 0)
        self._write_summary("running")

    def extend_columns(self, extra: tuple[str, ...]) -> None:
        """Add columns a run knows only once its data is loaded (per-domain accuracies);
        before its first new round: the file is written again with them."""
        self.columns = self.columns + tuple(c for c in extra if c not in self.columns)
        self._write_rows()

    def _write_rows(self) -> None:
        self.rows = []
        with open(self.results_path, "w", newline="") as f:
            csv.writer(f).writerow(self.columns)
        for row in self._given_rows:
            self.append(row)

    def append(self, row: Mapping[str, Any]) -> None:
        row = {column: row.get(column, math.nan) for column in self.columns}
        self.rows.append(row)
        with open(self.results_path, "a", newline="") as f:
            csv.writer(f).writerow([row[c] for c in self.columns])
            f.flush()
            os.fsync(f.fileno())
        if self.trackers is not None and row["round"] not in self.tracked_rounds:  # once, also when rewritten
            self.tracked_rounds.add(row["round"])
            self.trackers.log_round(row)

    def append_client_evaluation(self, server_round: int, clients: Sequence[Mapping[str, Any]]) -> None:
        """Add a round's per-client rows (client-evaluation) to ``client-evaluation.csv``; the
        summary's ``client-accuracy`` is of the newest round's."""
        if self.clients_path is None:
            return
        if clients:
            self.described["client-accuracy"] = client_accuracy_summary(server_round, [c["accuracy"] for c in clients])
        with open(self.clients_path, "a", newline="") as f:
            writer = csv.writer(f)
            writer.writerows([[server_round, *(client[c] for c in CLIENT_EVALUATION_COLUMNS[1:])] for client in clients])
            f.flush()
            os.fsync(f.fileno())

    def _keep_client_rows_until(self, server_round: int) -> None:
        """The per-client file with its header and the rows of rounds up to ``server_round``
        (a resumed run's checkpoint round: the later ones will be run again)."""
        kept = []
        if server_round and self.clients_path.exists():  # type: ignore[union-attr]
            with open(self.clients_path, newline="") as f:  # type: ignore[arg-type]
                kept = [row for row in list(csv.reader(f))[1:] if row and int(row[0]) <= server_round]
        with open(self.clients_path, "w", newline="") as f:  # type: ignore[arg-type]
            csv.writer(f).writerows([CLIENT_EVALUATION_COLUMNS, *kept])

    def describe(self, **entries: Any) -> None:
        """Keep ``entries`` in ``summary.json`` from now on (e.g. what fixed the arithmetic)."""
        self.described.update(entries)
        self._write_summary("running")

    def record_clients_layout(self, channels_last: float) -> None:
        """summary.json's ``arithmetic.memory-format``: the clients' training layout as their
        replies report it (``channels_last``: the share of a round's examples trained
        channels-last); the layout follows each client's own device, not the ServerApp's."""
        layout = ("channels-last" if channels_last == 1 else "contiguous" if channels_last == 0
                  else f"mixed ({channels_last:.0%} of the examples channels-last)")
        self.described.setdefault("arithmetic", {})["memory-format"] = layout
        self._write_summary("running")

    def training_starts(self) -> None:
        """Mark the end of the ServerApp's start-up (data, model, clients discovered)."""
        self.training_started = time.time()

    def complete(self) -> dict[str, Any]:
        return self._end("completed")

    def fail(self, error: BaseException) -> dict[str, Any]:
        return self._end("failed", error=f"{type(error).__name__}: {error}")

    def _end(self, status: str, **extra: Any) -> dict[str, Any]:
        # The trackers finish (W&B flushes its run) before summary.json records the end:
        # the launcher stops every process of the run once it reads that.
        if self.trackers is not None:
            self.trackers.finish(self._summary(status, **extra), sorted(self.directory.glob("*.png")))
        return self._write_summary(status, **extra)

    def _write_summary(self, status: str, **extra: Any) -> dict[str, Any]:
        summary = self._summary(status, **extra)
        write_json_atomic(self.directory / "summary.json", summary)
        return summary

    def _summary(self, status: str, **extra: Any) -> dict[str, Any]:
        return {
            "status": status,
            "wall-seconds": time.time() - self.started,
            "started-at": self.started,
            **({"training-started-at": self.training_started} if self.training_started else {}),
            **summarize(self.rows, self.last_k, self.target),
            **({"resumed-after-round": self.resumed_after} if self.resumed_after else {}),
            **self.described,
            **extra,
        }
