"""Curvature of a model's training loss: FedAlign's second-order indicators (FedAlign §3.4,
Table 1, Fig 1), as its code computes them (pyhessian/hessian.py, compute_hessian.py,
parse_logs.py).

λ_max by power iteration with deflation (:func:`power_iteration`), the trace and block
traces by Hutchinson's estimator (:func:`hutchinson`), both on Hessian-vector products of
the batch-mean cross-entropy (:class:`HessianOperator`); H_N and H_D across clients
(FedAlign Eqs. 3–4, :func:`pair_indicators`); and Fig 1's eigen-surface (``--surface``):
the training loss at θ + a·ε0 + b·ε1 over a, b ∈ [−1, 1] (41 × 41), ε0, ε1 the top-2
unit eigenvectors. Client Hessians use the global training set, as FedAlign's code does.

Command (tables per run, so a sweep gives λ_max and trace per method)::

    .venv/bin/python -m experiments.analysis hessian RUN_OR_SWEEP_DIR... [--model base] [--clients] [--surface]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from clients.training import select_device
from experiments.analysis.inputs import (
    AnalysisRun,
    find_runs,
    finished,
    pyplot,
    save_figure,
    save_table,
    theta_space,
    tool_parser,
)
from experiments.analysis.interpolation import parse_model_spec, pick_model
from experiments.analysis.landscape import Plane, evaluate_plane, model_scorer
from experiments.runtime.output_dir import create_output_dir
from experiments.runtime.progress import progress_bar

Vectors = list[torch.Tensor]
HVP = Callable[[Vectors], Vectors]


def dot(a: Vectors, b: Vectors) -> torch.Tensor:
    return sum((x * y).sum() for x, y in zip(a, b))


def normalized(v: Vectors) -> Vectors:
    norm = torch.sqrt(dot(v, v))
    return [x / (norm + 1e-6) for x in v]


def hessian_vector_product(loss: torch.Tensor, params: Sequence[torch.Tensor], v: Vectors) -> Vectors:
    """H v of ``loss`` with respect to ``params`` (double backward)."""
    gradients = torch.autograd.grad(loss, params, create_graph=True)
    return list(torch.autograd.grad(gradients, params, grad_outputs=v))


class HessianOperator:
    """v ↦ H v of a model's batch-mean cross-entropy, averaged over mini-batches by size.

    The model is in eval mode (BatchNorm uses its running statistics) and θ is every tensor
    with ``requires_grad``. One product Hv = ∂(∇L·v)/∂θ (double backward) over ``batches``
    mini-batches of the training set is Σ_b |b|·H_b v / Σ_b |b|; every product draws new
    random batches, as FedAlign's shuffling loader does (first 10 batches of 64), unless
    ``fixed_batches``. Training-set augmentation is not applied (Basin's choice; FedAlign's
    loader augments).
    """

    def __init__(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 64, batches: int = 10,
        seed: int = 1, fixed_batches: bool = False,
    ):
        self.model = model.eval()
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.x, self.y = x, y
        self.batch_size, self.batches = batch_size, batches
        self.generator = torch.Generator().manual_seed(seed)
        self.fixed = self._draw() if fixed_batches else None

    def _draw(self) -> list[torch.Tensor]:
        """``batches`` random mini-batches (drop-last, no repeats): a shuffled loader's first ones."""
        order = torch.randperm(len(self.y), generator=self.generator)
        return [order[i * self.batch_size : (i + 1) * self.batch_size] for i in range(min(self.batches, len(self.y) // self.batch_size))]

    def __call__(self, v: Vectors) -> Vectors:
        total = [torch.zeros_like(p) for p in self.params]
        count = 0
        device = self.params[0].device
        for index in self.fixed or self._draw():
            x, y = self.x[index].to(device), self.y[index].to(device)
            loss = F.cross_entropy(self.model(x), y)
            for t, hv in zip(total, hessian_vector_product(loss, self.params, v)):
                t.add_(hv.detach(), alpha=len(index))
            count += len(index)
        return [t / count for t in total]

    def like(self) -> Vectors:
        return [torch.zeros_like(p) for p in self.params]


def power_iteration(
    hvp: HVP, like: Vectors, top_n: int = 1, max_iter: int = 100, tol: float = 1e-3, seed: int = 1,
) -> tuple[list[float], list[Vectors]]:
    """The ``top_n`` eigenvalues of largest magnitude (signed) and their unit eigenvectors.

    Per eigenvalue: v ~ N(0, I), v ← v/(‖v‖ + 1e-6); up to ``max_iter`` times: orthonormalise
    v against the eigenvectors found, λ = vᵀHv, v ← Hv/‖Hv‖; stop when
    |λ − λ_prev|/(|λ_prev| + 1e-6) < ``tol`` (keeping λ_prev, as pyhessian does).
    """
    generator = torch.Generator().manual_seed(seed)
    eigenvalues: list[float] = []
    eigenvectors: list[Vectors] = []
    for _ in range(top_n):
        v = normalized([torch.randn(x.shape, generator=generator, dtype=x.dtype).to(x.device) for x in like])
        eigenvalue = None
        for _ in progress_bar(range(max_iter), desc=f"eigenvalue {len(eigenvalues) + 1}", unit="hvp", leave=False):
            for e in eigenvectors:  # deflation: orthogonal to the eigenvectors found
                v = [x - dot(v, e) * y for x, y in zip(v, e)]
            v = normalized(v)
            hv = hvp(v)
            estimate = float(dot(hv, v))
            v = normalized(hv)
            if eigenvalue is not None and abs(eigenvalue - estimate) / (abs(eigenvalue) + 1e-6) < tol:
                break
            eigenvalue = estimate
        eigenvalues.append(eigenvalue)
        eigenvectors.append(v)
    return eigenvalues, eigenvectors


def hutchinson(
    hvp: HVP, like: Vectors, max_iter: int = 100, tol: float = 1e-3, seed: int = 1, diagonal: bool = False,
) -> dict[str, object]:
    """Hutchinson's trace: ``trace`` (mean zᵀHz), ``block-traces`` (per tensor, mean
    z_lᵀ(Hz)_l), ``samples``, and with ``diagonal`` the estimate mean z ⊙ Hz (flattened).

    z has i.i.d. Rademacher entries; stop after sample i when |mean(t_1..i) − m_{i−1}| /
    (|m_{i−1}| + 1e-6) < ``tol`` (m_0 = 0), at most ``max_iter`` samples. The block traces
    estimate tr H_11 … tr H_LL: what FedAlign's code saves as ``diag.npy`` and uses as
    "Diag(H)". ``diagonal`` also estimates the true d-dimensional diagonal (the paper's
    Diag(H)); the tables say which is used.
    """
    generator = torch.Generator().manual_seed(seed)
    samples: list[float] = []
    blocks: list[np.ndarray] = []
    diagonal_sum = None
    previous_mean = 0.0
    for _ in progress_bar(range(max_iter), desc="trace", unit="hvp", leave=False):
        z = [(torch.randint(0, 2, x.shape, generator=generator) * 2 - 1).to(x.device, x.dtype) for x in like]
        hz = hvp(z)
        block = np.array([float((a * b).sum()) for a, b in zip(z, hz)])
        blocks.append(block)
        samples.append(float(block.sum()))
        if diagonal:
            product = torch.cat([(a * b).reshape(-1) for a, b in zip(z, hz)]).double().cpu()
            diagonal_sum = product if diagonal_sum is None else diagonal_sum + product
        mean = float(np.mean(samples))
        if abs(mean - previous_mean) / (abs(previous_mean) + 1e-6) < tol:
            break
        previous_mean = mean
    result: dict[str, object] = {"trace": float(np.mean(samples)), "block-traces": np.mean(blocks, axis=0), "samples": len(samples)}
    if diagonal:
        result["diagonal"] = (diagonal_sum / len(samples)).numpy()
    return result


def pair_indicators(vectors: Sequence[np.ndarray]) -> dict[str, object]:
    """H_N and H_D of client curvature vectors: the K×K matrices and both pair averages.

    For client vectors d_k: H_N^{k,j} = (‖d_k‖ − ‖d_j‖)², H_D^{k,j} = d_k·d_j/(‖d_k‖‖d_j‖).
    ``pairs``: the mean over pairs k ≠ j (the paper's words); ``code``: the mean of the K×K
    matrix with k = j included (parse_logs.py) = ((K−1)/K)·pairs for H_N and
    1/K + ((K−1)/K)·pairs for H_D. Both are reported.
    """
    d = np.stack([np.asarray(v, dtype=np.float64) for v in vectors])
    norms = np.linalg.norm(d, axis=1)
    hn = (norms[:, None] - norms[None, :]) ** 2
    hd = (d @ d.T) / np.outer(norms, norms)
    off = ~np.eye(len(d), dtype=bool)
    return {
        "hn-matrix": hn, "hd-matrix": hd,
        "hn-pairs": float(hn[off].mean()), "hd-pairs": float(hd[off].mean()),
        "hn-code": float(hn.mean()), "hd-code": float(hd.mean()),
    }


def model_with(run: AnalysisRun, state, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    model = run.build_model()
    model.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
    return model.to(device)


def curvature_of(run: AnalysisRun, state, args, top_n: int) -> tuple[list[float], list[Vectors], dict[str, object]]:
    """λ's, eigenvectors and Hutchinson's estimates of one model; each estimate draws its
    batches from its own seeded stream, so the trace does not depend on ``top_n``."""
    model = model_with(run, state, select_device(args.device))

    def operator() -> HessianOperator:
        return HessianOperator(model, run.data.x_train, run.data.y_train, args.batch_size, args.batches, args.seed,
                               args.fixed_batches)

    eigen = operator()
    eigenvalues, eigenvectors = power_iteration(eigen, eigen.like(), top_n, args.max_iter, args.tol, args.seed)
    traced = operator()
    return eigenvalues, eigenvectors, hutchinson(traced, traced.like(), args.max_iter, args.tol, args.seed, args.diagonal)


def plot_pairs(indicators: dict[str, object], clients: Sequence[int], title: str):
    figure, axes = pyplot().subplots(1, 2, figsize=(10, 4.3))
    for ax, key, name in zip(axes, ("hn-matrix", "hd-matrix"), ("H_N (lower: closer curvature norms)", "H_D (cosine, higher: aligned)")):
        image = ax.imshow(indicators[key], cmap="viridis")
        ax.set_xticks(range(len(clients)), clients)
        ax.set_yticks(range(len(clients)), clients)
        ax.set(xlabel="client (partition)", ylabel="client (partition)", title=name)
        figure.colorbar(image, ax=ax, shrink=0.85)
    return finished(figure, title)


def plot_surface(a: np.ndarray, b: np.ndarray, z: np.ndarray, title: str):
    figure = pyplot().figure(figsize=(6.5, 5.5))
    ax = figure.add_subplot(projection="3d")
    grid_a, grid_b = np.meshgrid(a, b)
    ax.plot_surface(grid_a, grid_b, z, cmap="viridis", linewidth=0, antialiased=True)
    ax.set(xlabel="a (ε0)", ylabel="b (ε1)", zlabel="training loss", title=title)
    ax.view_init(elev=25, azim=45)
    return figure


def main(argv: Sequence[str] | None = None) -> int:
    parser = tool_parser("hessian", __doc__)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories or sweep folders with saved models")
    parser.add_argument("--model", type=parse_model_spec, default="base",
                        help="the global model: base or averaged, optionally @ROUND (default: base of the last saved round)")
    parser.add_argument("--clients", action="store_true", help="also each saved client model of that round, and H_N/H_D")
    parser.add_argument("--surface", action="store_true", help="the loss surface along the top-2 eigenvectors (Fig 1)")
    parser.add_argument("--surface-points", type=int, default=41)
    parser.add_argument("--top-n", type=int, default=1, help="eigenvalues to find (2 with --surface)")
    parser.add_argument("--diagonal", action="store_true", help="also the true Hessian diagonal (Hutchinson); H_N/H_D then use it")
    parser.add_argument("--batches", type=int, default=10, help="mini-batches per Hessian-vector product (FedAlign: 10)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--fixed-batches", action="store_true", help="the same batches for every product")
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--tol", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--out", type=Path, default=None, help="folder for the tables (default: the first run's analysis/)")
    args = parser.parse_args(argv)
    if args.out is not None:  # a bad folder is named before any model is read
        args.out = create_output_dir(args.out, "--out")
    for name in ("batches", "batch_size", "max_iter", "top_n"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: allowed: an integer >= 1")
    top_n = max(args.top_n, 2 if args.surface else 1)
    runs = find_runs(args.runs)
    out = args.out or runs[0].output_dir
    rows, block_rows, pair_rows = [], [], []
    for run in progress_bar(runs, desc="runs", unit="run", disable=len(runs) == 1):
        picked = pick_model(run, args.model)
        if picked is None:
            print(f"skipped {run.directory.name}: no {args.model} model saved", flush=True)
            continue
        name, state = picked
        eigenvalues, eigenvectors, trace = curvature_of(run, state, args, top_n)
        names = [n for n, p in run.build_model().named_parameters() if p.requires_grad]
        rows.append({"run": run.directory.name, "method": run.label, "model": name,
                     **{f"lambda-{i + 1}": value for i, value in enumerate(eigenvalues)},
                     "trace": trace["trace"], "trace-samples": trace["samples"]})
        block_rows += [{"run": run.directory.name, "model": name, "tensor": n, "block-trace": float(t)}
                       for n, t in zip(names, trace["block-traces"])]
        if args.surface:
            surface_of(run, state, eigenvectors, args, out, name)
        if args.clients:
            pair_rows.append(client_pairs(run, name, args, out))
    if not rows:
        raise ValueError(f"no run has a {args.model!r} model saved")
    table = pd.DataFrame(rows)
    save_table(table, out / "hessian.csv")
    save_table(pd.DataFrame(block_rows), out / "hessian-block-traces.csv")
    if pair_rows:
        save_table(pd.DataFrame(pair_rows), out / "hn-hd.csv")
    print(table.to_string(index=False), flush=True)
    return 0


def client_pairs(run: AnalysisRun, global_name: str, args, out: Path) -> dict[str, object]:
    """Each saved client model's curvature vector of the round, then H_N/H_D (table + figure)."""
    server_round = int(global_name.partition("@")[2])
    clients = run.models(server_round)["clients"]
    if len(clients) < 2:
        raise ValueError(f"--clients: round {server_round} of {run.directory} saved {len(clients)} client model(s); H_N/H_D need >= 2")
    vectors, rows = [], []
    for pid, state in progress_bar(clients.items(), desc="client Hessians", unit="client"):
        _, _, trace = curvature_of(run, state, args, 1)
        vector = trace["diagonal"] if args.diagonal else trace["block-traces"]
        vectors.append(vector)
        rows.append({"client": pid, "trace": trace["trace"], "curvature-norm": float(np.linalg.norm(vector))})
    kind = "diagonal" if args.diagonal else "block-traces"
    indicators = pair_indicators(vectors)
    save_table(pd.DataFrame(rows), out / f"hessian-clients-{run.directory.name}.csv")
    save_figure(plot_pairs(indicators, list(clients), f"{run.label}, round {server_round}: client curvature ({kind})"),
                out / f"hn-hd-{run.directory.name}.png")
    return {"run": run.directory.name, "method": run.label, "round": server_round, "clients": len(clients),
            "vector": kind, **{k: v for k, v in indicators.items() if not k.endswith("matrix")}}


def surface_of(run: AnalysisRun, state, eigenvectors: list[Vectors], args, out: Path, name: str) -> None:
    """The training loss on the plane of the top-2 eigenvectors through the model."""
    space = theta_space(run, args.device, reference=state)
    flat = [torch.cat([t.reshape(-1) for t in e]).to(space.device, torch.float64) for e in eigenvectors[:2]]
    plane = Plane(space.theta(state).double(), flat[0], flat[1])
    axis = torch.linspace(-1, 1, args.surface_points, dtype=torch.float64)
    score = model_scorer(space, run.data.x_train, run.data.y_train, 1024)
    z = evaluate_plane(score, plane, axis, axis, max(1, space.models_per_pass // args.surface_points))["loss"]
    grid_b, grid_a = np.meshgrid(axis.numpy(), axis.numpy(), indexing="ij")
    save_table(pd.DataFrame({"a": grid_a.ravel(), "b": grid_b.ravel(), "loss": z.ravel()}),
               out / f"eigen-surface-{run.directory.name}.csv")
    save_figure(plot_surface(axis.numpy(), axis.numpy(), z, f"{run.label} {name}: loss along ε0, ε1"),
                out / f"eigen-surface-{run.directory.name}.png")
