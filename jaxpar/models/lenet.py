"""The small LeNet-style convnet of the source documents' MNIST experiments (Keras mnist_cnn,
seed 002): conv 32 -> conv 64 -> 2x2 max-pool -> dropout 0.25 -> dense 128 -> dropout 0.5 ->
dense classes. `dropout=False` leaves the two dropouts out (the same function in evaluation)."""

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
    dropout: bool = False,
) -> SequentialModel:
    kw = {} if dtype is None else {"dtype": dtype}
    rates = (0.25, 0.5) if dropout else (0.0, 0.0)  # Keras mnist_cnn's
    blocks = [
        (
            "conv1",
            ConvBlock(
                scaled(32, width), padding="VALID", batch_norm=batch_norm, in_axis="image", **kw
            ),
        ),
        (
            "conv2",
            ConvBlock(
                scaled(64, width),
                padding="VALID",
                batch_norm=batch_norm,
                pool=True,
                dropout=rates[0],
                **kw,
            ),
        ),
        (
            "fc1",
            DenseBlock(scaled(128, width), in_axis="embed", out_axis="mlp", dropout=rates[1], **kw),
        ),
        ("fc2", DenseBlock(num_classes, relu=False, in_axis="mlp", out_axis="classes", **kw)),
    ]
    layers, shape = [], tuple(input_shape)
    for name, block in blocks:
        layers.append(make_layer(name, block, shape))
        shape = layers[-1].out_shape
    return SequentialModel("lenet", tuple(layers), tuple(input_shape), num_classes)
