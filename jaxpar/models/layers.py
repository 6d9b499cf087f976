"""The layer blocks models are built from. Each block knows its forward FLOPs per example."""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpar.models.batch_norm import BatchNorm

# torchvision's VGG initialisation: He (fan-out) for convs, N(0, 0.01) for dense layers, so the
# first logits are small and the initial loss is about log(classes).
CONV_INIT = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
DENSE_INIT = nn.initializers.normal(0.01)
# He (fan-in) for hidden dense layers of models without BatchNorm (AlexNet): three N(0, 0.01)
# layers in a row shrink the signal ~50x and the net barely starts learning.
DENSE_HE_INIT = nn.initializers.variance_scaling(2.0, "fan_in", "normal")


# Every logical axis name a layer gives its variables or activations. Sharding rules
# (`tensor.rules`) may only name these; a misspelt name would silently split nothing.
# "height": the rows of a feature map (activations only; the spatial axis splits them).
LOGICAL_AXES = (
    "batch",
    "height",
    "image",
    "conv_in",
    "conv_out",
    "embed",
    "mlp",
    "hidden",
    "classes",
)


def wide(dtype) -> Any:
    """The dtype of a model's parameters (so of its gradients and updates) and of its logits,
    for a compute `dtype`: float32 for float32 and bfloat16 compute, float64 for float64.
    A float64 run is a numerical check, so it is float64 throughout: with float32 parameters
    each data replica's gradient would round to float32 before the all-reduce while one device
    rounds the whole batch's once, and float32 logits would give a float32 loss summed in
    different orders; chaotic models (Inception-v3, ResNet-50 at tiny widths) grow those
    ulps to 1e-2 in three steps."""
    return jnp.promote_types(dtype, jnp.float32)


def named(init, names: tuple):
    """flax's logical partitioning: the variable is created boxed with its dimensions' logical
    names (`nn.get_partition_spec` reads them; sharding rules map them to mesh axes)."""
    return nn.with_logical_partitioning(init, names)


def dropout(x, rate: float, keys):
    """Inverted dropout with one key per example (`keys`: [batch] keys), so that an example's
    mask does not depend on which device or micro-batch it lands on: every partitioning draws
    the single-device program's masks."""
    if keys is None:
        raise ValueError("dropout needs per-example keys: the batch lacks its 'example' ids")
    keep = jax.vmap(lambda k: jax.random.bernoulli(k, 1.0 - rate, x.shape[1:]))(keys)
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


class ConvBlock(nn.Module):
    """Conv (3x3 by default) -> optional BatchNorm -> ReLU -> optional 2x2 max-pool ->
    optional dropout (training only)."""

    features: int
    kernel: int = 3
    padding: str = "SAME"
    batch_norm: bool = False
    pool: bool = False
    in_axis: str = "conv_in"  # logical name of the input channels ("image" for the first conv)
    dtype: Any = jnp.float32
    bn_axis_name: Any = None
    dropout: float = 0.0  # rate

    @nn.compact
    def __call__(self, x, train: bool, keys=None):
        # Output channels may be split over a mesh axis (tensor), rows too (spatial).
        channel = ("conv_out",)
        x = nn.Conv(
            self.features,
            (self.kernel, self.kernel),
            padding=self.padding,
            dtype=self.dtype,
            param_dtype=wide(self.dtype),
            kernel_init=named(CONV_INIT, (None, None, self.in_axis, "conv_out")),
            bias_init=named(nn.initializers.zeros_init(), channel),
        )(x)
        if self.batch_norm:
            # BatchNorm's running mean and variance follow its scale's names (flax creates
            # them without an initialiser to box; parallel/tensor.py reads them from scale).
            x = BatchNorm(
                use_running_average=not train,
                momentum=0.9,
                epsilon=1e-5,
                dtype=self.dtype,
                param_dtype=wide(self.dtype),
                axis_name=self.bn_axis_name if train else None,
                scale_init=named(nn.initializers.ones_init(), channel),
                bias_init=named(nn.initializers.zeros_init(), channel),
            )(x)
        x = nn.relu(x)
        if self.pool:
            x = nn.max_pool(x, (2, 2), strides=(2, 2))
        if train and self.dropout:
            x = dropout(x, self.dropout, keys)
        return x

    # Logical names of the output activation (sharding rules pin it inside the step).
    out_axes = ("batch", "height", None, "conv_out")

    def flops(self, in_shape: tuple[int, ...]) -> int:
        h, w, c = in_shape
        if self.padding == "VALID":
            h, w = h - self.kernel + 1, w - self.kernel + 1
        return 2 * h * w * self.kernel * self.kernel * c * self.features


class DenseBlock(nn.Module):
    """Flatten (if needed) -> Dense -> optional ReLU -> optional dropout (training only). The
    last one emits float32 logits (float64 in float64 runs: `wide`)."""

    features: int
    relu: bool = True
    in_axis: str | None = "embed"  # logical names of the kernel's input and output features
    out_axis: str | None = "classes"
    dtype: Any = jnp.float32
    bn_axis_name: Any = None  # unused; keeps every block's interface the same
    dropout: float = 0.0  # rate
    he_init: bool = False  # DENSE_HE_INIT instead of DENSE_INIT

    @nn.compact
    def __call__(self, x, train: bool, keys=None):
        x = x.reshape((x.shape[0], -1))
        init = DENSE_HE_INIT if self.he_init else DENSE_INIT
        x = nn.Dense(
            self.features,
            dtype=self.dtype,
            param_dtype=wide(self.dtype),
            kernel_init=named(init, (self.in_axis, self.out_axis)),
            bias_init=named(nn.initializers.zeros_init(), (self.out_axis,)),
        )(x)
        if not self.relu:
            return x.astype(wide(self.dtype))
        x = nn.relu(x)
        return dropout(x, self.dropout, keys) if train and self.dropout else x

    @property
    def out_axes(self) -> tuple:
        return ("batch", self.out_axis)

    def flops(self, in_shape: tuple[int, ...]) -> int:
        return 2 * math.prod(in_shape) * self.features
