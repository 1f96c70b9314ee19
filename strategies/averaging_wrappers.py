"""IMA, WIMA and server SWA as classes around any Flower strategy, for a user's own ServerApp
(``from strategies import IMA``): the averaging component (strategies/averaging.py) with each
paper's settings, refusing a base whose clients must be Basin's unless the app says they are.
Their keywords are the run config's keys: ``window``, ``avg_start`` (t_s), ``avg_feedback``,
``avg_subset``, ``swa_cycle``."""

from __future__ import annotations

from typing import Any

from flwr.serverapp.strategy import Strategy

from strategies.averaging import ModelAveraging

# The wrappers' keywords are the run config's keys, hyphens as underscores (avg-start:
# avg_start); the names of earlier releases, each refused naming its new name.
EARLIER_NAMES = {"start_round": "avg_start", "subset": "avg_subset", "feedback": "avg_feedback", "cycle": "swa_cycle"}


def _refuse_other_keywords(name: str, keywords: dict[str, Any]) -> None:
    """Raise TypeError for the first keyword the wrapper does not take, naming its new name."""
    if not keywords:
        return
    keyword = next(iter(keywords))
    renamed = EARLIER_NAMES.get(keyword)
    why = f"the keyword is {renamed} now, the run config's {renamed.replace('_', '-')}" if renamed else "no such keyword"
    raise TypeError(f"{name}(…, {keyword}=…): {why}; see docs/your-own-app.md")


def _checked_base(strategy: Strategy, basin_clients: bool, name: str) -> Strategy:
    """``strategy``, unless it needs Basin's ClientApp and the caller did not say it has one."""
    client_half = getattr(strategy, "client_half", "")
    if client_half and not basin_clients:
        raise ValueError(
            f"{name}({type(strategy).__name__}(...)): {type(strategy).__name__} needs Basin's ClientApp "
            f"(strategies.client_app:app) for {client_half}; a stock Flower ClientApp trains plain local SGD and "
            f"ignores it. Pass basin_clients=True when your app's clients are Basin's, or wrap a server-only "
            f"strategy (Flower's FedAvg, FedAdam, …)"
        )
    return strategy


class IMA(ModelAveraging):
    """IMA (Zhou, Lin, Zhang, Tsang, "Understanding and Improving Model Averaging in Federated
    Learning on Heterogeneous Data", IEEE TMC 2024, eq. 4) around any Flower strategy: from
    ``avg_start`` (t_s) on, the clients receive the mean of the last ``window`` (P) global
    models the strategy produced, w_IMA^t = (1/P) Σ_{i<P} w^{t−i}.

    Memory: ``window`` copies of the model (the window fills from round t_s − P + 1).
    Use with Flower's loop: ``IMA(FedAvg(...), window=5, avg_start=150).start(grid=grid,
    initial_arrays=arrays, num_rounds=200)``; the result's arrays are the last model sent,
    the average from t_s on. On Basin's FedAdam/FedYogi/FedAdagrad the window mean is the
    target of the optimiser's step (the authors' ordering); on Flower's own, the window of
    its outputs is sent. :meth:`state_dict` / :meth:`load_state_dict` checkpoint the window.
    IMA's client-side exploration schedule (lr decay after t_s) is the clients' business:
    Basin's ClientApp follows ``lr`` in the round config.

    **IMA on an adaptive server optimiser** (FedAdam, FedYogi, FedAdagrad; strategies/fedopt.py)
    has its own ordering by default (``optimizer_target=True``; run config
    ``ima-server-opt = fma-target``), as the paper ("storing P global models obtained by FMA")
    and its authors' ``utils/aggregator.py`` (modes ``fedadam+ima``, ``fedyogi+ima``,
    ``fedadagrad+ima``) do: the window holds each round's **FMA aggregate** (the clients'
    weighted mean), not the optimiser's output; from t_s on the window mean is the **target**
    of the optimiser's step, Δ = mean − w with w the model sent; m and v are reset to zero at
    t_s (FedAdam and FedYogi; the code does not reset FedAdagrad's); the clients receive the
    optimiser's output. In results.csv that output is the averaged (sent) model and the
    round's FMA the base model (the authors log it as "before moving averaging").
    ``ima-server-opt = output-window`` is the older ordering: the window holds the
    optimiser's outputs and their mean is sent, as for any other base.
    """

    def __init__(self, strategy: Strategy, window: int = 5, avg_start: int = 1, avg_subset: str = "all",
                 basin_clients: bool = False, **other: Any) -> None:
        _refuse_other_keywords("IMA", other)
        super().__init__(_checked_base(strategy, basin_clients, "IMA"), window, avg_start, feedback=True,
                         subset=avg_subset, optimizer_target=hasattr(strategy, "step_target"))


class WIMA(ModelAveraging):
    """WIMA (Caldarola, Caputo, Ciccone, "Window-based Model Averaging Improves
    Generalization in Heterogeneous Federated Learning", ICCV Workshops 2023, eq. 4) around any
    Flower strategy: from round ``window`` (W) on, a server-side shadow model, the mean of the
    last W global models; the clients keep receiving the strategy's own model unless
    ``avg_feedback``.

    Memory: ``window`` copies of the model. With Flower's loop the result's arrays are the
    strategy's last model; :meth:`final_arrays` (or ``averaged_arrays``) gives the shadow.
    """

    def __init__(self, strategy: Strategy, window: int = 5, avg_feedback: bool = False, avg_subset: str = "all",
                 basin_clients: bool = False, **other: Any) -> None:
        _refuse_other_keywords("WIMA", other)
        super().__init__(_checked_base(strategy, basin_clients, "WIMA"), window, window, feedback=avg_feedback,
                         subset=avg_subset)


class ServerSWA(ModelAveraging):
    """Server-side SWA (Caldarola, Caputo, Ciccone, "Improving Generalization in Federated
    Learning by Seeking Flat Minima", ECCV 2022) around any Flower strategy: from
    ``avg_start`` on, at the end of each lr cycle of ``swa_cycle`` rounds, w_SWA ← (n·w_SWA +
    w)/(n + 1); evaluation only (the clients receive the strategy's model).

    Memory: one copy of the model (a running mean). :meth:`final_arrays` gives w_SWA. The
    cyclic client lr of the paper is the clients' business.
    """

    def __init__(self, strategy: Strategy, avg_start: int = 1, swa_cycle: int = 1, avg_subset: str = "all",
                 basin_clients: bool = False, **other: Any) -> None:
        _refuse_other_keywords("ServerSWA", other)
        super().__init__(_checked_base(strategy, basin_clients, "ServerSWA"), None, avg_start, feedback=False,
                         sample_every=swa_cycle, subset=avg_subset)
