"""Models by name. Each has a final ``classifier`` linear layer (methods that treat the
classifier apart from the feature extractor rely on that name)."""

from __future__ import annotations

from torch import nn

from clients.models.cnn import cifar_cnn, fmnist_cnn
from clients.models.mlp import Mlp

MODEL_NAMES = ("mlp", "fmnist-cnn", "cifar-cnn")
# The model a data set gets when the run config says model = "auto".
DEFAULT_MODEL = {"digits": "mlp", "fashion-mnist": "fmnist-cnn", "cifar10": "cifar-cnn", "cifar100": "cifar-cnn"}
# The input shape each fixed-architecture model needs.
REQUIRED_INPUT = {"fmnist-cnn": (1, 28, 28), "cifar-cnn": (3, 32, 32)}


def resolve_model_name(model: str, dataset: str) -> str:
    if model != "auto":
        return model
    return DEFAULT_MODEL.get(dataset, "cifar-cnn")


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Build a freshly initialised model (callers seed torch for reproducible weights)."""
    required = REQUIRED_INPUT.get(name)
    if required is not None and tuple(input_shape) != required:
        raise ValueError(f"model {name!r} needs inputs of shape {required}, the data set has {tuple(input_shape)}")
    if name == "mlp":
        return Mlp(input_shape, num_classes)
    if name == "fmnist-cnn":
        return fmnist_cnn(num_classes)
    if name == "cifar-cnn":
        return cifar_cnn(num_classes)
    raise ValueError(f"unknown model {name!r}; allowed: {', '.join(MODEL_NAMES)}")
