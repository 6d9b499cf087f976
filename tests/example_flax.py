"""Networks written as a Flax user writes them, trained by jaxpar without a change:

    python -m jaxpar.train --config configs/vgg19_data.py \\
        --config.model.name=tests.example_flax:resnet

A builder `fn(model_config, input_shape, num_classes)` returns a flax.linen.Module whose
`__call__(x, train)` returns logits (jaxpar/models/flax_module.py). Here:

- `resnet`: a small ResNet (a stem, two residual stages of basic blocks with BatchNorm, a
  projection shortcut where the shape changes, global average pooling, a dense head), its
  parameters annotated with logical names (`nn.with_logical_partitioning`) so the tensor axis
  splits their channels by tensor.rules, and its feature map between the stages pinned to
  (batch, height, -, channels) (`nn.with_logical_constraint`), which the spatial axis splits;
- `resnet_plain`: the same network without annotations, for rules over parameter paths
  (`model.param_rules`) or fsdp's own rule;
- `sequential`: a stack of convolution blocks, a function and a head (with dropout where
  `model_config.dropout`), annotated like `resnet`, in a list attribute its `__call__` runs in order, which a pipeline
  cuts between its entries (`layers_0`, `layers_1`, ...) with `--config.model.layers=layers`.

`model_config.width` scales the channels and `model_config.dtype` is the compute and
parameter dtype (float64 for numerical checks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float64": jnp.float64}


def _init(init, names, annotate: bool):
    return nn.with_logical_partitioning(init, names) if annotate else init


class BasicBlock(nn.Module):
    features: int
    strides: int = 1
    annotate: bool = True
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool):
        conv = lambda f, k, s, name: nn.Conv(
            f,
            (k, k),
            (s, s),
            use_bias=False,
            dtype=self.dtype,
            param_dtype=self.dtype,
            kernel_init=_init(
                nn.initializers.he_normal(), (None, None, "conv_in", "conv_out"), self.annotate
            ),
            name=name,
        )
        norm = lambda name: nn.BatchNorm(
            use_running_average=not train,
            momentum=0.9,
            dtype=self.dtype,
            param_dtype=self.dtype,
            scale_init=_init(nn.initializers.ones_init(), ("conv_out",), self.annotate),
            bias_init=_init(nn.initializers.zeros_init(), ("conv_out",), self.annotate),
            name=name,
        )
        y = nn.relu(norm("bn1")(conv(self.features, 3, self.strides, "conv1")(x)))
        y = norm("bn2")(conv(self.features, 3, 1, "conv2")(y))
        if x.shape[-1] != self.features or self.strides != 1:
            x = norm("proj_bn")(conv(self.features, 1, self.strides, "proj")(x))
        return nn.relu(x + y)


class ResNet(nn.Module):
    stage_features: Sequence[int]
    num_classes: int
    annotate: bool = True
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool):
        x = x.astype(self.dtype)
        x = BasicBlock(self.stage_features[0], annotate=self.annotate, dtype=self.dtype)(x, train)
        for features in self.stage_features[1:]:
            x = self._pin(x)
            x = BasicBlock(features, 2, annotate=self.annotate, dtype=self.dtype)(x, train)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(
            self.num_classes,
            dtype=self.dtype,
            param_dtype=self.dtype,
            kernel_init=_init(nn.initializers.lecun_normal(), ("embed", "classes"), self.annotate),
        )(x)

    def _pin(self, x):
        """The feature map's rows and channels named, for the rules axes (spatial, tensor)."""
        if not self.annotate:
            return x
        return nn.with_logical_constraint(x, ("batch", "height", None, "conv_out"))


class ConvBN(nn.Module):
    features: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool):
        channels = nn.with_logical_partitioning(nn.initializers.zeros_init(), ("conv_out",))
        x = nn.Conv(
            self.features,
            (3, 3),
            dtype=self.dtype,
            param_dtype=self.dtype,
            kernel_init=nn.with_logical_partitioning(
                nn.initializers.lecun_normal(), (None, None, "conv_in", "conv_out")
            ),
            bias_init=channels,
        )(x)
        x = nn.BatchNorm(
            use_running_average=not train,
            dtype=self.dtype,
            param_dtype=self.dtype,
            scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("conv_out",)),
            bias_init=channels,
        )(x)
        return nn.max_pool(nn.relu(x), (2, 2), (2, 2))


class Head(nn.Module):
    """Two dense layers, the first's outputs (and the second's inputs) named "mlp"."""

    hidden: int
    num_classes: int
    rate: float = 0.25
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool):
        dense = lambda n, names: nn.Dense(
            n,
            dtype=self.dtype,
            param_dtype=self.dtype,
            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), names),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), names[1:]),
        )
        x = nn.relu(dense(self.hidden, ("embed", "mlp"))(x.reshape(x.shape[0], -1)))
        x = nn.Dropout(self.rate, deterministic=not train)(x)
        return dense(self.num_classes, ("mlp", "classes"))(x)


def _channels(model_config, n: int) -> int:
    return max(2, 2 * round(n * model_config.width / 2))


def resnet(model_config, input_shape, num_classes) -> nn.Module:
    widths = tuple(_channels(model_config, n) for n in (32, 64))
    return ResNet(widths, num_classes, dtype=DTYPES[model_config.dtype])


def resnet_plain(model_config, input_shape, num_classes) -> nn.Module:
    widths = tuple(_channels(model_config, n) for n in (32, 64))
    return ResNet(widths, num_classes, annotate=False, dtype=DTYPES[model_config.dtype])


class Stack(nn.Module):
    """Its layers in order, `train` passed to those that take it (nn.Sequential passes its
    arguments to the first layer only)."""

    layers: Sequence[Any]

    def __call__(self, x, train: bool):
        for layer in self.layers:
            x = layer(x, train=train) if isinstance(layer, nn.Module) else layer(x)
        return x


def sequential(model_config, input_shape, num_classes) -> nn.Module:
    """A Stack: train it with --config.model.layers=layers for a pipeline to cut it."""
    dtype = DTYPES[model_config.dtype]
    rate = 0.25 if model_config.get("dropout", False) else 0.0
    return Stack(
        [
            ConvBN(_channels(model_config, 32), dtype=dtype),
            ConvBN(_channels(model_config, 64), dtype=dtype),
            nn.relu,
            Head(_channels(model_config, 64), num_classes, rate=rate, dtype=dtype),
        ]
    )
