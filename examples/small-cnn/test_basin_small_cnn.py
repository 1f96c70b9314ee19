"""The small CNN's shapes: one logit per class from images of any size, its representation
the classifier's input."""

import torch
from basin_small_cnn.model import small_cnn


def test_it_gives_one_logit_per_class_from_images_of_any_size():
    model = small_cnn(7, (3, 12, 9))
    x = torch.randn(5, 3, 12, 9)
    assert model(x).shape == (5, 7)
    assert torch.equal(model.classifier(model.represent(x)), model(x))
