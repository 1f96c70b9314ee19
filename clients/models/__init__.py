"""Models by name. Each has a final ``classifier`` linear layer (methods that treat the
classifier apart from the feature extractor rely on that name) and a ``represent(x)``
method giving the representation fed to it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from clients.model_names import (  # noqa: F401  (re-exported: the models by name)
    DEFAULT_MODEL,
    MIN_SIDE,
    MODEL_NAMES,
    PROJECTION_HEAD_MODELS,
    REQUIRED_INPUT,
    SEQUENCE_MODELS,
    SLIMMABLE_MODELS,
    resolve_model_name,
)
from clients.model_plugins import MODEL_PLUGINS
from clients.models.alexnet import AlexNetGn
from clients.models.cnn import DigitFiveCnn, FemnistCnn, cifar_cnn, fmnist_cnn
from clients.models.lstm import CharLstm
from clients.models.mlp import Mlp
from clients.models.resnet import resnet18_bn, resnet18_gn, resnet20_gn, resnet56, resnet56_bn
from clients.models.slimmable import StagedNet
from clients.models.vgg import vgg11_gn

# Builders of the models that take any (C, H, W) input with H, W >= MIN_SIDE (adaptive pooling).
_ANY_SIZE = {
    "resnet20-gn": resnet20_gn, "resnet56": resnet56, "resnet56-bn": resnet56_bn, "resnet18-gn": resnet18_gn,
    "resnet18-bn": resnet18_bn, "vgg11-gn": vgg11_gn, "alexnet-gn": AlexNetGn,
}


def is_slimmable(model: nn.Module) -> bool:
    """Whether ``model`` has width-slimmable stages (a :class:`StagedNet`)."""
    return isinstance(model, StagedNet)


def uses_projection_head(model: str, strategy: str) -> bool:
    """MOON on FedAlign's ResNet-56 trains it with a two-layer projection head (the other
    models' MLP heads already play that role)."""
    from clients.halves import installed

    return model in PROJECTION_HEAD_MODELS and strategy in installed().projection_head


def build_run_model(run_config: Mapping[str, Any], input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The model a run config names (``model``, resolved for ``dataset``, with MOON's head
    where :func:`uses_projection_head`)."""
    name = resolve_model_name(str(run_config["model"]), str(run_config["dataset"]))
    return build_model(name, input_shape, num_classes, uses_projection_head(name, str(run_config["strategy"])))


def _plugin_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A model plug-in's model, checked against what its declaration says: its inputs against
    the data set's, and each of ``offers`` on the model it built (a ``classifier`` linear
    layer, a callable ``represent``), so a plug-in that lies is named before round 1."""
    spec = MODEL_PLUGINS[name]
    holds = "token sequences" if len(input_shape) == 1 else f"images of shape {tuple(input_shape)}"
    if (spec.inputs == "sequence") != (len(input_shape) == 1):
        raise ValueError(f"model plug-in {name!r} declares inputs = {spec.inputs!r}, but the data set holds {holds}; "
                         f"allowed: a model plug-in whose inputs fit the data set")
    model = spec(num_classes, input_shape)
    offered = {"classifier": isinstance(getattr(model, "classifier", None), nn.Linear),
               "represent": callable(getattr(model, "represent", None))}
    lacking = sorted(offer for offer in spec.offers if not offered[offer])
    if lacking:
        raise ValueError(f"model plug-in {name!r} declares offers = {{{', '.join(sorted(spec.offers))}}}, but the model "
                         f"it builds ({type(model).__name__}) has no {' and no '.join(lacking)} (classifier: a linear "
                         f"layer named classifier; represent: a method giving the classifier's input); declare only "
                         f"what it has")
    return model


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, projection_head: bool = False) -> nn.Module:
    """Build a freshly initialised model (callers seed torch for reproducible weights);
    ``projection_head`` only for :data:`PROJECTION_HEAD_MODELS`."""
    if projection_head and name not in PROJECTION_HEAD_MODELS:
        raise ValueError(f"model {name!r} has no projection-head variant; allowed: {', '.join(PROJECTION_HEAD_MODELS)}")
    if name in MODEL_PLUGINS:
        return _plugin_model(name, input_shape, num_classes)
    required = REQUIRED_INPUT.get(name)
    if required is not None and tuple(input_shape) != required:
        raise ValueError(f"model {name!r} needs inputs of shape {required}, the data set has {tuple(input_shape)}")
    if name not in SEQUENCE_MODELS and len(input_shape) == 1:
        raise ValueError(f"model {name!r} takes images; the data set holds token sequences; allowed: {', '.join(SEQUENCE_MODELS)}")
    if name == "mlp":
        return Mlp(input_shape, num_classes)
    if name == "fmnist-cnn":
        return fmnist_cnn(num_classes)
    if name == "cifar-cnn":
        return cifar_cnn(num_classes)
    if name == "digit5-cnn":
        return DigitFiveCnn(num_classes)
    if name == "femnist-cnn":
        return FemnistCnn(num_classes)
    if name == "char-lstm":
        if len(input_shape) != 1:
            raise ValueError(f"model 'char-lstm' needs token sequences (N, T), the data set has inputs {tuple(input_shape)}")
        return CharLstm(num_classes)
    if name in _ANY_SIZE:
        if len(input_shape) != 3 or min(input_shape[1:]) < MIN_SIDE:
            raise ValueError(
                f"model {name!r} needs image inputs (C, H, W) with H, W >= {MIN_SIDE}, "
                f"the data set has {tuple(input_shape)}"
            )
        extra = {"projection": True} if projection_head else {}
        return _ANY_SIZE[name](num_classes, in_channels=input_shape[0], **extra)
    raise ValueError(f"unknown model {name!r}; allowed: {', '.join((*MODEL_NAMES, *MODEL_PLUGINS))}")
