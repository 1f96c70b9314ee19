"""Seeded client sampling through partition ids, and order-independent aggregation.

Node ids are random per start of a federation, so a seed alone cannot make Flower's
``random.sample`` over node ids reproducible. Basin learns every node's partition id
once (in simulation from the engine in the ServerApp's own process, in a deployment by a
``query`` message to every node: strategies/discovery.py), samples *partition ids* with a generator seeded by
(seed, round), and sorts replies by partition id before aggregating, so floating-point
sums happen in the same order in every run and in every engine. A participation model
(strategies/participation.py) narrows each round's draw to the partitions available in it;
the simulated clock (strategies/system_clock.py) adds each sampled client's speed and
bandwidth to its message, and its late replies are dropped, not failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, cast

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from clients import protocol
from clients.log import log
from strategies.discovery import query_partitions
from strategies.exchange import ASSIGNED_PARTITIONS, with_config_entries
from strategies.participation import ParticipationModel
from strategies.reply_screening import NODE_UNAVAILABLE, ClientFailure, Layout, layout_of, screen_replies
from strategies.round_interface import RoundStrategy
from strategies.round_metrics import client_usage, late_replies, reply_metrics
from strategies.system_clock import SystemClock
from strategies.weighted_mean import array_view


class CohortGrid(Grid):
    """A Grid whose connected nodes are only the round's sampled cohort.

    Passed to an unmodified Flower strategy's ``configure_train`` (with
    ``fraction_train=1``), it makes the strategy address exactly the cohort Basin chose
    while every hook of the strategy (FedOpt's bookkeeping, FedProx's config) still runs.
    Everything but the node ids is the run's grid's.
    """

    def __init__(self, grid: Grid, node_ids: list[int]):
        self._grid = grid
        self._node_ids = node_ids

    def get_node_ids(self) -> Iterable[int]:
        return list(self._node_ids)

    # A run's type is Flower's private flwr.supercore.run.Run.
    def set_run(self, run: Any) -> None:
        self._grid.set_run(run)

    @property
    def run(self) -> Any:
        return self._grid.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return self._grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self._grid.send_and_receive(messages, timeout=timeout)


class CohortSampling(RoundStrategy):
    """Mixin, listed before a Flower strategy class, that samples seeded cohorts and
    screens their replies (strategies/reply_screening.py) before aggregating.

    Call :meth:`bind_partitions` once before the first round. Subclasses that aggregate
    differently override :meth:`aggregate_accepted`, which only ever sees screened replies
    in partition order. A round with fewer than ``min_replies`` accepted replies is skipped:
    :meth:`aggregate_train` returns ``(None, None)`` and ``round_status`` says why.
    """

    partition_of_node: dict[int, int]
    cohort_size: int
    seed: int
    min_replies: int = 1

    def bind_partitions(self, partition_of_node: dict[int, int], cohort_size: int, seed: int, min_replies: int = 1,
                        skip_unavailable: bool = False, follow_trained_rounds: bool = False,
                        participation: ParticipationModel | None = None, clock: SystemClock | None = None,
                        local_epochs: Callable[[int, list[int]], dict[int, int] | None] | None = None) -> None:
        if not 1 <= min_replies <= cohort_size:
            raise ValueError(f"min_replies must be between 1 and the cohort size {cohort_size}, got {min_replies}")
        self.partition_of_node = dict(partition_of_node)
        # A federation of named nodes (strategies/discovery.Federation): partition p's name.
        self.partition_names: list[str] | None = getattr(partition_of_node, "names", None)
        self._assign_partitions()
        self.ignored_nodes: set[int] = set()
        self.cohort_size = cohort_size
        self.seed = seed
        self.min_replies = min_replies
        self.sent_to: dict[int, int] = {}
        self.sent_layout: Layout | None = None
        self.round_clients: dict[str, float] = {}
        self.round_failures: list[ClientFailure] = []
        self.round_replies: list[Message] = []
        self.round_records: list[dict[str, ArrayRecord]] = []
        self.round_status = ""
        # Nodes Flower has reported unavailable (dead SuperNodes); with skip_unavailable
        # their partitions are left out of the sampling until they rejoin under a new id.
        self.skip_unavailable = skip_unavailable
        self.unavailable_nodes: set[int] = set()
        # With client-state snapshots (strategies/server_work.py): {partition: the last round its
        # reply was accepted in}, sent to it, so a node that lost its client state says so.
        self.trained_rounds: dict[int, int] | None = {} if follow_trained_rounds else None
        # Who is available each round (strategies/participation.py; uniform: everyone, no draw),
        # the simulated clock (strategies/system_clock.py) and per-client local epochs, or None.
        self.participation = participation or ParticipationModel()
        self.clock = clock
        self.local_epochs = local_epochs
        self.round_available = 0
        self.too_few_available = False

    def _assign_partitions(self) -> None:
        """Tell the exchange each named node's partition id (strategies/exchange.py)."""
        ASSIGNED_PARTITIONS.clear()
        if self.partition_names is not None:
            count = len(self.partition_names)
            ASSIGNED_PARTITIONS.update({node: (p, count) for node, p in self.partition_of_node.items()})

    def follow_rejoined_nodes(self, grid: Grid, timeout: float) -> None:
        """Map partitions to the nodes that hold them now.

        A SuperNode that restarts comes back under a new node id. Nodes the map does not
        know are asked for their partition (or name), which then moves to them; until a node
        returns, messages for its partition fail (counted as timeouts). A named node that
        joins with a new name becomes the next partition, sampled from the next round on. A
        new node that cannot say which partition it holds is reported and left out.
        """
        new = sorted(set(grid.get_node_ids()) - set(self.partition_of_node) - self.ignored_nodes)
        if not new:
            return
        found, problems, names, _ = query_partitions(grid, new, len(self.partition_of_node), timeout)
        if self.partition_names is None:
            found = {node: partition for node, partition in found.items() if 0 <= partition < len(self.partition_of_node)}
        else:  # named nodes only: a partition id is no identity here
            found = {}
            for node, name in names.items():
                if name not in self.partition_names:
                    self.partition_names.append(name)
                    log.info(f"node {node} joined as {name!r}: partition {len(self.partition_names) - 1}, sampled "
                             f"from the next round on")
                found[node] = self.partition_names.index(name)
        # Asked once: a node that cannot say which partition it holds must not cost every round a timeout.
        self.ignored_nodes.update(set(new) - set(found))
        for node, reason in problems.items():
            log.warning(f"new node {node} ignored: {reason}")
        if found:
            moved = set(found.values())
            self.partition_of_node = {n: p for n, p in self.partition_of_node.items() if p not in moved} | found
            self._assign_partitions()
            log.info(f"partitions {sorted(moved)} now on nodes {sorted(found)} (rejoined)")

    def sample_partitions(self, server_round: int) -> list[int]:
        """The sorted partition ids of a round's cohort, sampled from the partitions available in
        the round: by default every partition (depends only on seed and round, so a dead node's
        partition is still sampled and counted failed); under a participation model those it
        makes available (a function of seed, round and partition), none when fewer than
        ``min_replies`` are; with ``skip_unavailable``, without the partitions whose node Flower
        has reported unavailable (the cohort then depends on when nodes died)."""
        rng = np.random.default_rng([self.seed, server_round])
        num_partitions = len(self.partition_of_node)
        available = self.participation.available(server_round, num_partitions)
        dead = self.skip_unavailable and self.unavailable_nodes
        if available is None and not dead:
            self.round_available = num_partitions
            chosen = rng.choice(num_partitions, size=self.cohort_size, replace=False)
            return sorted(int(p) for p in chosen)
        pool = np.flatnonzero(available) if available is not None else np.arange(num_partitions)
        if dead:
            gone = {p for n, p in self.partition_of_node.items() if n in self.unavailable_nodes}
            pool = np.array([p for p in pool if p not in gone], dtype=np.int64)
        self.round_available = len(pool)
        if available is not None and len(pool) < self.min_replies:
            return []
        chosen = rng.choice(len(pool), size=min(self.cohort_size, len(pool)), replace=False)
        return sorted(int(pool[int(i)]) for i in chosen)

    def client_entries(self, server_round: int, partitions: list[int]) -> dict[int, dict[str, Any]]:
        """Each sampled partition's own config entries: the round its reply was last accepted in
        (client-state snapshots), its speed and bandwidth (the clock), its local epochs
        (local-epochs-range)."""
        entries: dict[int, dict[str, Any]] = {p: {} for p in partitions}
        if self.trained_rounds:
            for p in partitions:
                if trained := self.trained_rounds.get(p):
                    entries[p][protocol.CLIENT_STATE_TRAINED_ROUND] = trained
        if self.clock is not None:
            for p in partitions:
                entries[p].update(self.clock.client_entries(p))
        epochs = self.local_epochs(server_round, partitions) if self.local_epochs is not None else None
        for p, local_epochs in (epochs or {}).items():
            entries[p]["local-epochs"] = local_epochs
        return entries

    @property
    def node_of_partition(self) -> dict[int, int]:
        """{partition id: node id}, built once per map (not every round: O(K))."""
        if getattr(self, "_inverse_of", None) is not self.partition_of_node:
            self._inverse_of = self.partition_of_node
            self._node_of_partition = {p: n for n, p in self.partition_of_node.items()}
        return self._node_of_partition

    def bind_to_grid(self, grid: Grid, seed: int = 0) -> None:
        """Bind to the grid's nodes, each its own partition in node-id order: how the
        strategy runs in a Flower app's own ServerApp (``strategy.start(...)``), whose loop
        does not discover partitions. It waits for ``min_available_nodes`` like Flower's
        sampling; the cohort is Flower's sample size, ``fraction_train`` of the nodes (at
        least ``min_train_nodes``), drawn seeded by round."""
        while len(list(grid.get_node_ids())) < self.min_available_nodes:  # type: ignore[attr-defined]  # Flower's FedAvg's
            time.sleep(1.0)
        nodes = sorted(grid.get_node_ids())
        fraction, minimum = self.fraction_train, self.min_train_nodes  # type: ignore[attr-defined]
        if self.client_half:
            log.warning(f"{type(self).__name__} needs Basin's ClientApp (strategies.client_app:app) for "
                        f"{self.client_half}; a stock Flower ClientApp does not do it")
        self.bind_partitions({node: index for index, node in enumerate(nodes)},
                             min(len(nodes), max(int(len(nodes) * fraction), minimum, 1)), seed)

    def configure_train(self, server_round, arrays, config, grid):
        if not hasattr(self, "partition_of_node"):  # in a Flower app's own ServerApp
            self.bind_to_grid(grid)
        node_of_partition = self.node_of_partition
        self.sent_to = {node_of_partition[p]: p for p in self.sample_partitions(server_round)}
        self.sent_layout = layout_of(arrays)
        self.too_few_available = not self.sent_to
        if self.too_few_available:  # under a participation model: the round is skipped (aggregate_train says so)
            return []
        messages = super().configure_train(server_round, arrays, config, CohortGrid(grid, list(self.sent_to)))
        own = self.client_entries(server_round, sorted(self.sent_to.values()))
        return [with_config_entries(message, entries) if (entries := own[self.sent_to[message.metadata.dst_node_id]])
                else message for message in messages]

    def aggregate_train(self, server_round, replies):
        replies = list(replies) if not hasattr(replies, "destinations") else replies
        # missed the deadline (the clock): dropped, not failed
        late = late_replies(replies) if self.clock is not None else {}
        sent_to = {node: p for node, p in self.sent_to.items() if node not in late} if late else self.sent_to
        accepted, self.round_failures = screen_replies(
            [reply for reply in replies if reply.metadata.src_node_id not in late] if late else replies,
            sent_to, self.partition_of_node, self.arrayrecord_key, self.sent_layout,
            getattr(replies, "destinations", None),
        )
        self.unavailable_nodes.update(f.node_id for f in self.round_failures if NODE_UNAVAILABLE in f.reason.lower())
        self.round_clients = {"clients-ok": len(accepted), "clients-failed": len(self.round_failures), **client_usage(accepted)}
        if self.participation.name != "uniform":
            self.round_clients["clients-available"] = self.round_available
        if self.clock is not None:
            self.round_clients.update(self.clock_of_round(accepted, late))
        self.round_replies = accepted
        if self.trained_rounds is not None:
            self.trained_rounds.update({self.sent_to[reply.metadata.src_node_id]: server_round for reply in accepted})
        # What a method's clients send besides their model (its declaration's reply_records),
        # handed to the method (declared_records) and taken out of the replies: Flower's FedAvg,
        # which checks and averages them, expects exactly one ArrayRecord per reply.
        key = self.arrayrecord_key  # type: ignore[attr-defined]  # Flower's FedAvg's
        self.round_records = [{name: reply.content.pop(name) for name in list(reply.content.array_records) if name != key}
                              for reply in accepted]
        if self.too_few_available:
            self.round_status = (f"skipped: {self.round_available} available clients "
                                 f"({self.participation.name} participation), fewer than min-replies = {self.min_replies}")
            return None, None
        if len(accepted) < self.min_replies:
            self.round_status = f"skipped: {len(accepted)} accepted replies, fewer than min-replies = {self.min_replies}"
            return None, None
        self.round_status = "aggregated"
        return self.aggregate_accepted(server_round, accepted)

    def clock_of_round(self, accepted: list[Message], late: dict[int, float]) -> dict[str, float]:
        """The round on the simulated clock: its seconds (the slowest client's, the deadline at
        most), the clients dropped at the deadline and those that sent partial work."""
        seconds, partial = list(late.values()), 0
        for reply in accepted:
            metrics = reply_metrics(reply)
            seconds.append(float(metrics.get(protocol.SIMULATED_SECONDS, 0.0)))
            partial += int(metrics.get("local-steps", 0)) < int(metrics.get(protocol.PLANNED_STEPS, 0))
        assert self.clock is not None
        # a client cut short or dropped works until the deadline: the server waits until then
        round_seconds = self.clock.deadline if late or partial else self.clock.round_seconds(seconds)
        return {"simulated-seconds": round_seconds, "clients-late": len(late),
                "clients-partial": partial}

    def aggregate_accepted(self, server_round: int, replies: list[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate screened replies (partition order): the Flower strategy's own rule."""
        return super().aggregate_train(server_round, replies)

    def declared_records(self, name: str) -> list[ArrayRecord]:
        """The ArrayRecord ``name`` of each of the round's accepted replies (partition order, as
        ``aggregate_accepted`` sees them): a record the method declares its clients send.
        Raises ValueError naming the replies that lack it."""
        lacking = [self.partition_of_node.get(reply.metadata.src_node_id, reply.metadata.src_node_id)
                   for reply, records in zip(self.round_replies, self.round_records) if name not in records]
        if lacking:
            raise ValueError(f"the replies of partitions {lacking} lack the '{name}' ArrayRecord their method declares")
        return [records[name] for records in self.round_records]

    def client_models(self, replies: Iterable[Message]) -> tuple[list[dict[str, np.ndarray]], list]:
        """The replies' models (read-only numpy views) and metric records."""
        replies = list(replies)
        key = self.arrayrecord_key  # type: ignore[attr-defined]  # Flower's FedAvg's, which this mixin is combined with
        models = [{k: array_view(a) for k, a in cast(ArrayRecord, r.content[key]).items()} for r in replies]
        return models, [next(iter(r.content.metric_records.values())) for r in replies]


    def round_client_evaluation(self) -> list[dict[str, Any]]:
        """With client-evaluation: per accepted client of the last round (partition order), the
        received model on its held-out split: partition, node, examples, accuracy, loss."""
        partition = {**self.partition_of_node, **self.sent_to}
        rows = []
        for reply in self.round_replies:
            metrics: dict[str, Any] = dict(next(iter(reply.content.metric_records.values())))
            if protocol.HELD_OUT_ACCURACY in metrics:
                node = reply.metadata.src_node_id
                rows.append({"partition": partition[node], "node": node,
                             "examples": int(metrics[protocol.HELD_OUT_EXAMPLES]),
                             "accuracy": float(metrics[protocol.HELD_OUT_ACCURACY]),
                             "loss": float(metrics[protocol.HELD_OUT_LOSS])})
        return rows

    def round_cohort(self) -> dict[int, int]:
        """The last round's sampled nodes: {node id: partition id}."""
        return dict(self.sent_to)

    def round_client_models(self, limit: int | None = None) -> dict[int, tuple[dict[str, np.ndarray], float]]:
        """The last round's accepted client models (at most ``limit``, partition order):
        {partition id: (state dict, sample count n_k)}."""
        replies = self.round_replies[:limit]
        partition = {**self.partition_of_node, **self.sent_to}
        models, metrics = self.client_models(replies)
        return {
            partition[reply.metadata.src_node_id]: (model, float(reported["num-examples"]))
            for reply, model, reported in zip(replies, models, metrics)
        }


class ServerUpdate(CohortSampling):
    """Mixin, listed before InPlaceFedAvg (strategies/weighted_mean.py), for methods whose new global model is their own
    function of the model sent and the cohort's models (FedNova, FedDyn, FedGMA).

    Flower's FedAvg still validates the replies and averages their metrics (its weighted
    mean of the models, unused here, is not computed); subclasses implement
    :meth:`server_update`.
    """

    sent_weights: dict[str, np.ndarray] | None = None

    def configure_train(self, server_round, arrays, config, grid):
        # Updates are taken against the model the clients received (under IMA: the average).
        self.sent_weights = {key: array_view(array) for key, array in arrays.items()}
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_accepted(self, server_round, replies):
        contents = self.checked_contents(replies)  # strategies/weighted_mean.InPlaceFedAvg's
        if not contents:
            return None, None
        metrics = self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        models, reported = self.client_models(replies)
        model = self.server_update(models, reported, replies)
        return ArrayRecord({key: Array(np.ascontiguousarray(value)) for key, value in model.items()}), metrics

    def server_update(
        self, models: list[dict[str, np.ndarray]], metrics: list[MetricRecord], replies: list[Message]
    ) -> dict[str, np.ndarray]:
        """The new global model from the cohort's models, metrics and replies (partition order)."""
        raise NotImplementedError
