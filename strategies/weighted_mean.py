"""FedAvg's weighted mean of the clients' models, read in place from their messages.

McMahan et al. (2017), Algorithm 1 (server): w_{t+1} = Σ_k (n_k / n) · w^k_{t+1}, with
n_k the ``num-examples`` a client reports and n their sum over the round's replies.

Flower's ``aggregate_arrayrecords`` computes it by decoding every array of every reply
with ``Array.numpy()``: ``np.load``, which parses the .npy header with a Python
``literal_eval`` and copies the values out of the message. For a small model that was
most of a round's aggregation time (10 replies × 10 arrays of the Fashion-MNIST CNN:
8 ms of 11 ms on one CPU core; 3 ms here). :func:`weighted_mean_arrays` performs the same arithmetic in the
same order (``mean = v_0·f_0``, then ``mean += v_k·f_k`` in reply order, f_k = n_k / n
as Python floats), so its result is bitwise Flower's; it only reads each array as a view
of the message's bytes, parsing each distinct .npy header once per process
(:func:`array_view`).

:class:`InPlaceFedAvg` is Flower's ``FedAvg`` with that mean. Every Basin strategy lists
it where Flower's ``FedAvg`` would come in its bases, so Flower's own strategies built on
FedAvg (FedAvgM, FedOpt, FedProx) reach it through ``super().aggregate_train``.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from numpy.lib import format as npy_format

from clients import flower_internals


def npy_header_length(data: bytes) -> int:
    """Bytes before the values in .npy ``data``: magic, version, length field and header."""
    major = data[6]
    if major == 1:
        return 10 + int.from_bytes(data[8:10], "little")
    return 12 + int.from_bytes(data[8:12], "little")


# The header readers of the .npy versions ``np.save`` writes for numeric arrays.
HEADER_READERS = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0}


@functools.lru_cache(maxsize=4096)
def npy_layout(header: bytes) -> tuple[tuple[int, ...], bool, np.dtype] | None:
    """(shape, fortran_order, dtype) that a .npy header declares, or None for a version
    or dtype read here only through ``np.load`` (cached: a run's arrays share a few dozen
    distinct headers)."""
    stream = io.BytesIO(header)
    reader = HEADER_READERS.get(npy_format.read_magic(stream))
    if reader is None:
        return None
    shape, fortran_order, dtype = reader(stream)
    return None if dtype.hasobject else (shape, fortran_order, dtype)


def array_view(array: Array) -> np.ndarray:
    """The values of a Flower ``Array`` as a read-only view of its bytes: equal to
    ``array.numpy()`` in shape, dtype, order and every value (which it returns, decoded,
    for the rare .npy version or object dtype it does not read in place)."""
    data = array.data
    offset = npy_header_length(data)
    layout = npy_layout(bytes(data[:offset])) if array.stype == flower_internals.numpy_stype() else None
    if layout is None:
        return array.numpy()
    shape, fortran_order, dtype = layout
    count = math.prod(shape)
    values = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    if fortran_order:  # as numpy.lib.format.read_array does
        return values.reshape(shape[::-1]).transpose()
    return values.reshape(shape)


def weighted_mean_arrays(records: list[RecordDict], weighting_metric_name: str) -> ArrayRecord:
    """Flower 1.41's ``aggregate_arrayrecords``, bitwise, reading arrays in place."""
    weights = [float(next(iter(record.metric_records.values()))[weighting_metric_name]) for record in records]  # type: ignore[arg-type]
    total_weight = sum(weights)
    factors = [weight / total_weight for weight in weights]
    mean: dict[str, np.ndarray] = {}
    for record, factor in zip(records, factors, strict=True):
        for arrays in record.array_records.values():
            for key, array in arrays.items():
                if key not in mean:
                    mean[key] = array_view(array) * factor
                else:
                    mean[key] += array_view(array) * factor
    return ArrayRecord({key: Array(np.asarray(value)) for key, value in mean.items()})


class InPlaceFedAvg(FlowerFedAvg):
    """Flower's FedAvg, its weighted mean computed by :func:`weighted_mean_arrays`.

    ``private_mean``, when set (strategies/privacy.ServerSideDP sets it), takes the place of
    that mean: a method declared ``dp_aggregate = "mean"`` or ``"step-on-mean"``
    (strategies/methods/method_spec.py) reaches its aggregate only through this one call, so
    under server-side DP its model, or the input of its server step, is the private mean."""

    private_mean: Callable[[int, list[RecordDict]], ArrayRecord] | None = None

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower 1.41's ``FedAvg.aggregate_train``: the same checks, the same mean (on
        another Flower release, Flower's own: clients/flower_internals/); under DP the
        private mean."""
        if self.private_mean is None and not flower_internals.speed_up_available("in-place mean"):
            return super().aggregate_train(server_round, replies)
        contents = self.checked_contents(replies)
        if not contents:
            return None, None
        mean = (weighted_mean_arrays(contents, self.weighted_by_key) if self.private_mean is None
                else self.private_mean(server_round, contents))
        return mean, self.train_metrics_aggr_fn(contents, self.weighted_by_key)

    def checked_contents(self, replies: Iterable[Message]) -> list[RecordDict]:
        """The contents of the replies without an error, after Flower's consistency checks
        (on another Flower release: the replies without an error)."""
        replies = list(replies)
        if not flower_internals.speed_up_available("in-place mean"):
            return [message.content for message in replies if not message.has_error()]
        valid_replies, _ = flower_internals.check_and_log_replies(self, replies, is_train=True)
        return [message.content for message in valid_replies]
