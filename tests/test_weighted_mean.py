"""FedAvg's weighted mean read in place (strategies/weighted_mean.py): bitwise Flower's."""

from __future__ import annotations

import importlib
import inspect
import io
import pkgutil

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.constant import SType
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from numpy.lib import format as npy_format

import strategies
from strategies.weighted_mean import InPlaceFedAvg, array_view, weighted_mean_arrays

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py

RNG = np.random.default_rng(7)
ARRAYS = {
    "c-order float32": RNG.standard_normal((3, 4, 5)).astype(np.float32),
    "fortran float32": np.asfortranarray(RNG.standard_normal((4, 6)).astype(np.float32)),
    "float64 scalar": np.asarray(RNG.standard_normal(), dtype=np.float64),
    "empty": np.zeros((0, 3), np.float32),
    "big-endian float64": RNG.standard_normal(9).astype(">f8"),
    "int64 counter": np.asarray(37, dtype=np.int64),
    "structured": np.zeros(4, dtype=[("a", "<f4"), ("b", "<i2")]),
}


def _npy_v2(values: np.ndarray) -> Array:
    """An Array whose bytes use .npy format 2.0 (numpy writes it for headers over 64 KiB)."""
    stream = io.BytesIO()
    npy_format.write_array(stream, values, version=(2, 0), allow_pickle=False)
    return Array(dtype=str(values.dtype), shape=tuple(values.shape), stype=SType.NUMPY, data=stream.getvalue())


@pytest.mark.parametrize("name", ARRAYS)
def test_in_place_view_is_numpy_decoding(name):
    array = Array(ARRAYS[name])
    view, decoded = array_view(array), array.numpy()
    assert view.shape == decoded.shape and view.dtype == decoded.dtype
    assert view.flags["F_CONTIGUOUS"] == decoded.flags["F_CONTIGUOUS"]
    assert view.tobytes(order="A") == decoded.tobytes(order="A")


def test_in_place_view_reads_format_2_headers():
    values = RNG.standard_normal((2, 3)).astype(np.float32)
    array = _npy_v2(values)
    assert array.data[6] == 2
    assert np.array_equal(array_view(array), values) and np.array_equal(array.numpy(), values)


def _reply_contents(num_replies: int) -> list[RecordDict]:
    contents = []
    for k in range(num_replies):
        arrays = {
            "conv.weight": RNG.standard_normal((8, 1, 5, 5)).astype(np.float32),
            "fc.weight": np.asfortranarray(RNG.standard_normal((10, 16)).astype(np.float32)),
            "bias64": RNG.standard_normal(10),
            "bn.num_batches_tracked": np.asarray(100 + k, dtype=np.int64),
        }
        metrics = MetricRecord({"num-examples": int(RNG.integers(7, 700)), "train-loss": float(RNG.random())})
        contents.append(RecordDict({"arrays": ArrayRecord({key: Array(v) for key, v in arrays.items()}), "metrics": metrics}))
    return contents


def _bytes(record: ArrayRecord) -> dict[str, tuple[str, tuple, bytes]]:
    return {key: (array.dtype, tuple(array.shape), array.data) for key, array in record.items()}


def test_weighted_mean_is_bitwise_flowers():
    contents = _reply_contents(7)
    assert _bytes(weighted_mean_arrays(contents, "num-examples")) == _bytes(aggregate_arrayrecords(contents, "num-examples"))


def test_in_place_fedavg_aggregates_as_flowers_fedavg():
    contents = _reply_contents(5)
    request = Message(content=RecordDict({"config": ConfigRecord()}), dst_node_id=3, message_type=MessageType.TRAIN)
    replies = [Message(content=content, reply_to=request) for content in contents]
    ours, flowers = InPlaceFedAvg(), FlowerFedAvg()
    arrays, metrics = ours.aggregate_train(1, replies)
    expected_arrays, expected_metrics = flowers.aggregate_train(1, replies)
    assert _bytes(arrays) == _bytes(expected_arrays)
    assert dict(metrics) == dict(expected_metrics)
    assert ours.aggregate_train(1, []) == flowers.aggregate_train(1, []) == (None, None)


def _basin_strategy_classes():
    for module_info in pkgutil.iter_modules(strategies.__path__):
        module = importlib.import_module(f"strategies.{module_info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, FlowerFedAvg) and cls is not InPlaceFedAvg:
                yield cls


def test_every_basin_strategy_reaches_the_in_place_mean():
    classes = list(_basin_strategy_classes())
    assert len(classes) >= 15
    for cls in classes:
        mro = cls.__mro__
        assert mro[mro.index(FlowerFedAvg) - 1] is InPlaceFedAvg, cls.__name__
