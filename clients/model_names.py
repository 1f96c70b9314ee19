"""The models' names and what the run config checks of them (input shapes, which take
sequences, which slim), without importing torch: the launcher validates a config with
these before Flower starts. The models themselves are in clients/models/."""

from __future__ import annotations

MODEL_NAMES = (
    "mlp", "fmnist-cnn", "cifar-cnn", "resnet20-gn", "resnet56", "resnet56-bn", "resnet18-gn", "resnet18-bn",
    "vgg11-gn", "alexnet-gn", "digit5-cnn", "femnist-cnn", "char-lstm",
)
# Models of token sequences (next-character prediction): the others take images.
SEQUENCE_MODELS = ("char-lstm",)
# Models that are StagedNet instances whose stages can run at a reduced width.
SLIMMABLE_MODELS = ("resnet20-gn", "resnet56", "resnet56-bn", "resnet18-gn", "resnet18-bn")
# Models without an MLP head, which MOON gives its two-layer projection head (FedAlign's code).
PROJECTION_HEAD_MODELS = ("resnet56", "resnet56-bn")
# The built-in models that hold buffers (BatchNorm's running statistics and
# num_batches_tracked), each with its GroupNorm counterpart: server-side DP refuses them, as
# Opacus refuses BatchNorm (tests/test_model_zoo.py builds every model to keep this exact).
GROUP_NORM_COUNTERPART = {"resnet56-bn": "resnet56", "resnet18-bn": "resnet18-gn"}
# The model a data set gets when the run config says model = "auto".
DEFAULT_MODEL = {"digits": "mlp", "fashion-mnist": "fmnist-cnn", "cifar10": "cifar-cnn", "cifar100": "cifar-cnn"}
# The input shape each fixed-architecture model needs.
REQUIRED_INPUT = {"fmnist-cnn": (1, 28, 28), "cifar-cnn": (3, 32, 32), "digit5-cnn": (3, 28, 28), "femnist-cnn": (1, 28, 28)}
# The smallest side the embedded 8×8 digits have; the strided stages need at least that.
MIN_SIDE = 8


def resolve_model_name(model: str, dataset: str) -> str:
    """The model a run uses: ``model``, or for ``"auto"`` the data set's default."""
    if model != "auto":
        return model
    return DEFAULT_MODEL.get(dataset, "cifar-cnn")
