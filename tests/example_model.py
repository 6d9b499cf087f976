"""A network of a user's own, partitioned by jaxpar without editing it: `model.name` takes
this builder's import path.

    python -m jaxpar.train --config configs/vgg19_hybrid.py \\
        --config.model.name=tests.example_model:build --config.mesh_shape='(2,2,2)'

`build(model_config, input_shape, num_classes)` returns a SequentialModel: an ordered tuple of
layers, each a flax module with the interface of jaxpar.models.layers.ConvBlock (`__call__(x,
train, keys=None)`, the fields `dtype`, `bn_axis_name` and `dropout`, `out_axes` naming its
output's dimensions, and `flops(in_shape)`), made into a Layer by `make_layer`. A pipeline
cuts between layers, the tensor axis splits the dimensions named "conv_out" and "mlp", the
spatial axis the rows named "height"; `model_config.width` and `batch_norm` mean what the
builder makes of them.

Here: a small "wide-then-narrow" convnet of three convolution blocks (the second without a
pool, the third with a 5x5 kernel) and a two-layer dense head, built from jaxpar's own
blocks; any flax module with that interface would do.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxpar.models import SequentialModel
from jaxpar.models.base import make_layer
from jaxpar.models.layers import ConvBlock, DenseBlock


def build(model_config, input_shape, num_classes) -> SequentialModel:
    c = lambda n: max(1, round(n * model_config.width))
    dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float64": jnp.float64}[
        model_config.dtype
    ]
    bn = bool(model_config.batch_norm)
    blocks = [
        ("wide", ConvBlock(c(64), batch_norm=bn, pool=True, in_axis="image", dtype=dtype)),
        ("mid", ConvBlock(c(32), batch_norm=bn, dtype=dtype)),
        ("narrow", ConvBlock(c(32), kernel=5, batch_norm=bn, pool=True, dtype=dtype)),
        ("fc1", DenseBlock(c(128), in_axis="embed", out_axis="mlp", dtype=dtype)),
        (
            "fc2",
            DenseBlock(num_classes, relu=False, in_axis="mlp", out_axis="classes", dtype=dtype),
        ),
    ]
    layers, shape = [], tuple(input_shape)
    for name, module in blocks:
        layers.append(make_layer(name, module, shape))
        shape = layers[-1].out_shape
    return SequentialModel("example", tuple(layers), tuple(input_shape), num_classes)
