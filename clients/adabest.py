"""AdaBest, client side (Varno, Saghayi, Rafiee Sevyeri, Gupta, Lagacé-Lebrun, Matwin,
"AdaBest: Minimizing Client Drift in Federated Learning via Adaptive Bias Estimation",
ECCV 2022, arXiv 2204.13170; strategies/adabest.py has the server and the sources).

Client i keeps a bias estimate h_i and the last round t_i′ it trained in (``context.state``;
h_i = 0 before its first round). In round t every local step subtracts h_i from the
gradient, g ← g − h_i (the gradient of ℓ − ⟨y, h_i⟩), and afterwards

    h_i ← h_i/(t − t_i′) + μ·(θ^{t−1} − y_K),   t_i′ ← t

(RickZack/GHBM's form, the default; GHBM never advances t_i′, so its decay is 1/t: Basin
keeps t_i′ per client as the method describes). The ``official-code`` variant (varnio/fedsim)
subtracts μ_ad·h_i with μ_ad = μ·m̄·E/n_i, m̄ the server's running mean of n_j/K_j over the
replies so far (0 in round 1), and updates h_i ← h_i/(t − t_i′) + (θ^{t−1} − y_K).
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from clients import protocol
from clients.client_step import GradientTerm
from clients.components import ClientComponent, StatefulTerm
from clients.protocol import ADABEST_CLIENT_BIAS, ADABEST_LAST_ROUND
from clients.state_store import stored_or_zeros


@torch.no_grad()
def subtract_bias(params: list[nn.Parameter], biases: list[torch.Tensor]) -> None:
    """g ← g − h_i (already scaled by μ_ad in the official-code variant)."""
    for param, bias in zip(params, biases):
        param.grad.sub_(bias)


def decayed_bias(bias: torch.Tensor, global_weight: torch.Tensor, local_weight: torch.Tensor, rounds_since: int,
                 step: float) -> torch.Tensor:
    """h_i/(t − t_i′) + step·(θ^{t−1} − y_K); ``rounds_since`` = t − t_i′ (≥ 1)."""
    return bias / rounds_since + step * (global_weight - local_weight)


class AdaBestClient:
    """One round of AdaBest on a client."""

    def __init__(self, model: nn.Module, state: RecordDict, mu: float, server_round: int, official_code: bool,
                 mean_examples_per_step: float, local_epochs: int):
        self.state = state
        self.mu = mu
        self.server_round = server_round
        self.official_code = official_code
        self.mean_examples_per_step = mean_examples_per_step
        self.local_epochs = local_epochs
        self.global_weights = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.bias = stored_or_zeros(state, ADABEST_CLIENT_BIAS, self.global_weights)
        last = state.get(ADABEST_LAST_ROUND)
        self.last_round = int(last.to_torch_state_dict()["round"]) if last is not None else 0

    def term(self, num_examples: int) -> GradientTerm:
        """The round's correction −h_i (−μ_ad·h_i in the official-code variant, with this client's n_i)."""
        scale = self.mu * self.mean_examples_per_step * self.local_epochs / num_examples if self.official_code else 1.0
        return GradientTerm("adabest", subtract_bias, [scale * self.bias[n] for n in self.global_weights])

    def state_norm(self) -> float:
        """‖h_i‖ as the round starts (0 before the client's first round)."""
        return float(torch.sqrt(sum((v.double() ** 2).sum() for v in self.bias.values())))

    @torch.no_grad()
    def finish(self, model: nn.Module) -> None:
        """Store the decayed bias estimate and this round for the client's next round."""
        rounds_since = max(self.server_round - self.last_round, 1)
        step = 1.0 if self.official_code else self.mu
        local = dict(model.named_parameters())
        updated = {n: decayed_bias(self.bias[n], w, local[n].detach(), rounds_since, step)
                   for n, w in self.global_weights.items()}
        self.state[ADABEST_CLIENT_BIAS] = ArrayRecord({k: v.cpu() for k, v in updated.items()})
        # An ArrayRecord, as every client state entry: snapshots keep ArrayRecords (clients/state_store.py).
        self.state[ADABEST_LAST_ROUND] = ArrayRecord({"round": torch.tensor(self.server_round)})


def adabest_component(model: nn.Module, content: RecordDict, state: RecordDict) -> ClientComponent | None:
    config = content["config"]
    if protocol.ADABEST_MU not in config:
        return None
    client = AdaBestClient(
        model, state, float(config[protocol.ADABEST_MU]), int(config["server-round"]),
        bool(config[protocol.ADABEST_OFFICIAL_CODE]), float(config[protocol.ADABEST_MEAN_EXAMPLES_PER_STEP]),
        int(config["local-epochs"]),
    )
    return StatefulTerm(client, client.term)  # the official-code μ_ad needs this client's n_i
