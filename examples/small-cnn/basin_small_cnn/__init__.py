"""A small CNN as a Basin model plug-in: its declaration (torch-free, so Basin's launcher
checks a run against it without importing torch); the model is in basin_small_cnn/model.py.

It takes images of any size and channels (C, H, W) and offers what Basin's methods that
work on representations use: ``represent(x)`` and a linear ``classifier``.
"""

from clients.declarations import ImplementedIn
from clients.model_plugins import ModelSpec

MODELS = (ModelSpec("small-cnn", ImplementedIn("basin_small_cnn.model:small_cnn"), inputs="image",
                    offers=frozenset({"classifier", "represent"})),)
