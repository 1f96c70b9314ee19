"""IMA's decomposition of the global model's error into its indicators (IMA §5, Figs 2–4).

IMA's Theorem 1 (MSE loss, n_k samples per client, p_k = n_k/n) splits the expected error of
the FMA model w_FMA = Σ_k p_k·w_k into a bias term, variance and covariance of the client
models, and the locality O(Δ²), Δ = max_k ‖w_k − w_FMA‖ (Lemma 1: FMA equals the weighted
ensemble f_WENS = Σ_k p_k·f_{w_k} up to O(Δ²)). The paper does not give its estimators;
Basin's (ANALYSIS.md's suggestion), per saved round t with the cohort's client models w_k:

- TrainBias, HeterBias and the bias term over D, the union of those clients' training
  sets, with E_{w_k} f_{w_k}(x) taken as the one trained model's f_{w_k^(t)}(x)
  (:func:`bias_terms`), and per client the mean squared error on and off its own data;
- the ensemble gap ‖f_WENS(x) − f_{w_FMA}(x)‖² of the logits, averaged over the first
  test samples (Lemma 1: zero to first order in Δ);
- locality Δ (max, the paper's "maximum distance") and the mean distance;
- client covariance as the mean linear CKA of the client models' logits on the global test
  set (Fig 4 right; strategies/indicators.py);
- test error of the uniform average of m of the round's client models, m = 1..K (Fig 4
  left): m models drawn without replacement in a seeded random order, ``--repeats`` orders.

Command (writes decomposition.csv, error-vs-models.csv and decomposition.png)::

    .venv/bin/python -m experiments.analysis decompose RUN_DIR [--round R] [--repeats 3]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from experiments.analysis.inputs import (
    AnalysisRun,
    ThetaSpace,
    finished,
    pyplot,
    resolve_round,
    save_figure,
    save_table,
    theta_space,
    tool_parser,
)
from experiments.runtime.progress import progress_bar
from strategies.indicators import CKA_SAMPLES, client_distances, mean_pairwise_cka


def bias_terms(
    predictions: torch.Tensor, targets: torch.Tensor, membership: torch.Tensor, weights: Sequence[float],
) -> dict[str, torch.Tensor | float]:
    """IMA Thm 1's bias terms from each client's predictions on D.

    f = softmax probabilities and y one-hot, so a squared error is ‖·‖² summed over classes;
    p_k = n_k / Σ_j n_j over the clients of D;
    TB = (1/n)·Σ_{(x,y)∈D} ‖Σ_k p_k·𝟙[(x,y)∈D_k]·(y − f_k(x))‖² (TrainBias),
    HB = the same with 𝟙[(x,y)∈D∖D_k] (HeterBias), and the bias term
    (1/n)·Σ_D ‖Σ_k p_k·(y − f_k(x))‖² (their sum inside the square: the indicators
    partition D); per client mean_{D_k} ‖y − f_k‖² and mean_{D∖D_k} ‖y − f_k‖².

    ``predictions`` (K, n, c): f_k(x) for every x of D; ``targets`` (n, c): y; ``membership``
    (K, n) bool: x ∈ D_k; ``weights`` (K,): p_k (normalised here). Returns ``train-bias``,
    ``heter-bias``, ``bias`` and per client ``client-train-mse``/``client-heter-mse`` (K,)
    (NaN where a client has no sample on that side).
    """
    p = torch.as_tensor(weights, dtype=predictions.dtype)
    p = (p / p.sum()).reshape(-1, 1, 1)
    residual = targets.unsqueeze(0) - predictions  # (K, n, c): y − f_k(x)
    inside = membership.unsqueeze(-1).to(predictions.dtype)
    squared = residual.pow(2).sum(dim=2)  # (K, n)

    def side_mean(mask: torch.Tensor) -> torch.Tensor:
        count = mask.sum(dim=1)
        return torch.where(count > 0, (squared * mask).sum(dim=1) / count.clamp(min=1), torch.nan)

    return {
        "train-bias": float((p * inside * residual).sum(dim=0).pow(2).sum(dim=1).mean()),
        "heter-bias": float((p * (1 - inside) * residual).sum(dim=0).pow(2).sum(dim=1).mean()),
        "bias": float((p * residual).sum(dim=0).pow(2).sum(dim=1).mean()),
        "client-train-mse": side_mean(membership.to(predictions.dtype)),
        "client-heter-mse": side_mean((~membership).to(predictions.dtype)),
    }


def ensemble_gap(space: ThetaSpace, client_thetas: torch.Tensor, weights: Sequence[float], x: torch.Tensor) -> float:
    """Lemma 1's gap: mean over x of ‖Σ_k p_k f_{w_k}(x) − f_{w_FMA}(x)‖², f the network's
    outputs (logits); w_FMA = Σ_k p_k w_k. Zero for a model linear in w; O(Δ²) otherwise."""
    p = torch.as_tensor(weights, dtype=torch.float64)
    p = p / p.sum()
    fma = p @ client_thetas.double()
    ensemble = sum(pk * space.outputs(theta, x).double() for pk, theta in zip(p, client_thetas))
    return float((ensemble - space.outputs(fma, x).double()).pow(2).sum(dim=1).mean())


def error_vs_count(
    space: ThetaSpace, client_thetas: torch.Tensor, x: torch.Tensor, y: torch.Tensor, repeats: int = 1, seed: int = 0,
    batch_size: int = 1024,
) -> pd.DataFrame:
    """Test loss and error of the uniform average of m client models, m = 1..K, for
    ``repeats`` seeded random orders (columns models, repeat, loss, error)."""
    rng = np.random.default_rng(seed)
    k = len(client_thetas)
    rows = []
    for repeat in range(repeats):
        order = torch.as_tensor(rng.permutation(k))
        cumulative = client_thetas[order].double().cumsum(dim=0)
        averages = (cumulative / torch.arange(1, k + 1, dtype=torch.float64).reshape(-1, 1)).float()
        loss, error = space.evaluate(averages, x, y, batch_size)
        rows += [{"models": m + 1, "repeat": repeat, "loss": loss[m], "error": error[m]} for m in range(k)]
    return pd.DataFrame(rows)


def round_decomposition(run: AnalysisRun, space: ThetaSpace, server_round: int, batch_size: int) -> dict[str, float] | None:
    """One saved round's indicators (None when it saved fewer than two client models)."""
    saved = run.models(server_round)
    if len(saved["clients"]) < 2:
        return None
    data, indices = run.data, run.client_indices()
    partitions = list(saved["clients"])
    weights = [saved["client-weights"][pid] for pid in partitions]
    thetas = torch.stack([space.theta(saved["clients"][pid]) for pid in partitions]).cpu()
    union = np.unique(np.concatenate([indices[pid] for pid in partitions]))
    membership = torch.stack([torch.as_tensor(np.isin(union, indices[pid])) for pid in partitions])
    x = data.x_train[torch.as_tensor(union)]
    targets = F.one_hot(data.y_train[torch.as_tensor(union)], data.num_classes).double()
    predictions = torch.stack([F.softmax(space.outputs(theta, x, batch_size).double(), dim=1) for theta in thetas])
    terms = bias_terms(predictions, targets, membership, weights)
    distances = client_distances(thetas.double(), weights)
    logits = [space.outputs(theta, data.x_test[:CKA_SAMPLES], batch_size) for theta in thetas]
    fma_loss, fma_error = space.evaluate(((torch.as_tensor(weights, dtype=torch.float64) / sum(weights)) @ thetas.double())
                                         .float()[None], data.x_test, data.y_test, batch_size)
    return {
        "round": server_round, "clients": len(partitions),
        "train-bias": terms["train-bias"], "heter-bias": terms["heter-bias"], "bias": terms["bias"],
        "client-train-mse": float(terms["client-train-mse"].nanmean()),
        "client-heter-mse": float(terms["client-heter-mse"].nanmean()),
        "ensemble-gap": ensemble_gap(space, thetas, weights, data.x_test[:CKA_SAMPLES]),
        "locality": float(distances.max()), "locality-mean": float(distances.mean()),
        "client-cka": mean_pairwise_cka(logits),
        "fma-test-loss": float(fma_loss[0]), "fma-test-error": float(fma_error[0]),
    }


def plot_decomposition(table: pd.DataFrame, counts: pd.DataFrame, results: pd.DataFrame, title: str):
    """IMA Figs 2–4: bias terms, locality, error vs number of averaged models, CKA."""
    figure, axes = pyplot().subplots(2, 2, figsize=(11, 8))
    bias_ax, locality_ax, count_ax, cka_ax = axes.ravel()
    bias_ax.plot(table["round"], table["train-bias"], "o-", label="TrainBias")
    bias_ax.plot(table["round"], table["heter-bias"], "s-", label="HeterBias")
    bias_ax.plot(table["round"], table["bias"], "^-", label="bias term")
    error_ax = bias_ax.twinx()
    error_ax.plot(results["round"], 100 * (1 - results["base-accuracy"]), color="grey", alpha=0.6, label="global test error")
    error_ax.set_ylabel("global test error (%)", color="grey")
    bias_ax.set(xlabel="round", ylabel="squared error (softmax vs one-hot)", title="bias terms (Fig 2)")
    bias_ax.legend(fontsize=8, loc="upper center")
    per_round = results.dropna(subset=["locality"]) if "locality" in results else results.iloc[:0]
    if len(per_round):
        locality_ax.plot(per_round["round"], per_round["locality"], color="C0", alpha=0.5, label="max, every round")
    locality_ax.plot(table["round"], table["locality"], "o", color="C0", label="max (saved rounds)")
    locality_ax.plot(table["round"], table["locality-mean"], "s", color="C1", label="mean (saved rounds)")
    locality_ax.set(xlabel="round", ylabel="‖w_k − w_FMA‖₂", title="locality Δ (Fig 3)")
    locality_ax.legend(fontsize=8)
    mean = counts.groupby("models")["error"].agg(["mean", "min", "max"])
    count_ax.plot(mean.index, mean["mean"], "o-")
    count_ax.fill_between(mean.index, mean["min"], mean["max"], alpha=0.2)
    count_ax.set(xlabel="number of averaged client models", ylabel="test error (%)",
                 title=f"error vs averaged models, round {int(counts['round'].iloc[0])} (Fig 4 left)")
    if len(per_round) and "client-cka" in per_round:
        cka_ax.plot(per_round["round"], per_round["client-cka"], color="C2", alpha=0.5, label="every round")
    cka_ax.plot(table["round"], table["client-cka"], "o", color="C2", label="saved rounds")
    cka_ax.set(xlabel="round", ylabel="mean linear CKA of client logits", title="client similarity (Fig 4 right)")
    cka_ax.legend(fontsize=8)
    for ax in axes.ravel():
        ax.grid(alpha=0.3)
    return finished(figure, title)


def main(argv: Sequence[str] | None = None) -> int:
    parser = tool_parser("decompose", __doc__)
    parser.add_argument("run", type=Path, help="a run directory with saved client models")
    parser.add_argument("--round", type=int, default=None, help="the round of the error-vs-models curve (default: last saved)")
    parser.add_argument("--repeats", type=int, default=3, help="random orders of the error-vs-models curve")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--batch-size", type=int, default=1024)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        raise ValueError(f"--repeats {args.repeats}: allowed: an integer >= 1")
    run = AnalysisRun.open(args.run)
    count_round = resolve_round(run, args.round)
    space = theta_space(run, args.device, reference=run.models(count_round)["base"])
    rows = [row for r in progress_bar(run.rounds(), desc="decomposing saved rounds", unit="round")
            if (row := round_decomposition(run, space, r, args.batch_size)) is not None]
    if not rows:
        raise ValueError(f"{run.directory}: no saved round has two or more client models (save-client-models >= 2)")
    table = pd.DataFrame(rows)
    saved = run.models(count_round)
    if len(saved["clients"]) < 2:
        raise ValueError(f"--round {count_round} saved {len(saved['clients'])} client model(s); allowed: a round with >= 2")
    thetas = torch.stack([space.theta(s) for s in saved["clients"].values()]).cpu()
    counts = error_vs_count(space, thetas, run.data.x_test, run.data.y_test, args.repeats, args.seed, args.batch_size)
    counts.insert(0, "round", count_round)
    out = run.output_dir
    save_table(table, out / "decomposition.csv")
    save_table(counts, out / "error-vs-models.csv")
    save_figure(plot_decomposition(table, counts, run.results(), f"{run.label} on {run.config['dataset']}: IMA's indicators"),
                out / "decomposition.png")
    return 0
