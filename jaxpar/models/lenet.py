"""The small LeNet-style convnet of the source documents' MNIST experiments (Keras mnist_cnn):
conv 32 -> conv 64 -> 2x2 max-pool -> dense 128 -> dense classes (dropout left out)."""

from __future__ import annotations

from typing import Any

from jaxpar.models.base import SequentialModel, make_layer
from jaxpar.models.layers import ConvBlock, DenseBlock
from jaxpar.models.vgg import scaled


def lenet(
    input_shape: tuple[int, int, int],
    num_classes: int,
    *,
    width: float = 1.0,
    batch_norm: bool = False,
    dtype: Any = None,
) -> SequentialModel:
    kw = {} if dtype is None else {"dtype": dtype}
    blocks = [
        (
            "conv1",
            ConvBlock(
                scaled(32, width), padding="VALID", batch_norm=batch_norm, in_axis="image", **kw
            ),
        ),
        (
            "conv2",
            ConvBlock(scaled(64, width), padding="VALID", batch_norm=batch_norm, pool=True, **kw),
        ),
        ("fc1", DenseBlock(scaled(128, width), in_axis="embed", out_axis="mlp", **kw)),
        ("fc2", DenseBlock(num_classes, relu=False, in_axis="mlp", out_axis="classes", **kw)),
    ]
    layers, shape = [], tuple(input_shape)
    for name, block in blocks:
        layers.append(make_layer(name, block, shape))
        shape = layers[-1].out_shape
    return SequentialModel("lenet", tuple(layers), tuple(input_shape), num_classes)
