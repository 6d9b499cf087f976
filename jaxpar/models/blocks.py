"""Blocks of the source documents' other models: residual blocks (basic and bottleneck), stems,
dense-net layers and transitions, and pooled heads (a block only one model uses lives with it:
Inception's modules in inception.py, AlexNet's stages in alexnet.py). Each is one cuttable unit of a SequentialModel: a pipeline cuts between blocks, never inside one, so a
residual add or a concatenation never crosses a stage boundary.

Every block has the interface of layers.ConvBlock: `__call__(x, train, keys=None)`, the fields
`dtype`, `bn_axis_name` and `dropout`, `out_axes` (its output's logical names) and
`flops(in_shape)` (forward FLOPs per example = 2 x the multiply-adds of its convolutions and
matmuls, counted from the traced program by `count_flops`, so no hand formula can drift).
Convolutions have no bias where BatchNorm follows (as in the originals). BatchNorm has
torchvision's parameters (scale and offset, momentum 0.1 in its convention = 0.9 here, epsilon
1e-5 unless a model says) but flax's running variance: the biased batch variance, where
torchvision keeps the unbiased one (n / (n - 1) larger), so an evaluation with running
statistics differs from torchvision's slightly (about 1e-4 relative on a small ResNet-50 run);
training, which normalises with the batch's own statistics, does not.
`batch_norm=False` (model.batch_norm) removes every BatchNorm and gives the convolutions it
followed or preceded a bias instead: one parameter per channel where BatchNorm had two.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxpar.models.batch_norm import BatchNorm
from jaxpar.models.layers import CONV_INIT, DENSE_INIT, named, wide
from jaxpar.models.trace import traced


def count_flops(module: nn.Module, in_shape: tuple[int, ...]) -> int:
    """Forward FLOPs per example of `module` on one example of `in_shape`: 2 x the
    multiply-adds of every convolution and matmul in its traced program (inference mode)."""
    return 2 * _macs(traced(module, in_shape).jaxpr.jaxpr)


def equations(jaxpr) -> Iterator:
    """Every equation of `jaxpr` in program order, each followed by those of the programs
    nested in it (jit, custom_jvp, ...)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from equations(inner)


def _macs(jaxpr) -> int:
    total = 0
    for eqn in equations(jaxpr):
        if eqn.primitive.name == "conv_general_dilated":
            rhs = eqn.invars[1].aval.shape
            out_dim = eqn.params["dimension_numbers"].rhs_spec[0]
            total += math.prod(eqn.outvars[0].aval.shape) * math.prod(rhs) // rhs[out_dim]
        elif eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contract)
    return total


class Block(nn.Module):
    """Shared fields and helpers of the blocks below."""

    dtype: Any = jnp.float32
    bn_axis_name: Any = None
    dropout: float = 0.0  # rate (only the AlexNet classifier uses it)
    bn_epsilon: float = 1e-5
    batch_norm: bool = True

    out_axes = ("batch", "height", None, "conv_out")

    def conv(self, x, features, kernel, stride=1, padding="SAME", in_axis="conv_in", bias=None):
        """A convolution whose output channels carry the logical name "conv_out"; with a bias
        where asked, or (bias=None) where the block has no BatchNorm."""
        bias = not self.batch_norm if bias is None else bias
        k = (kernel, kernel) if isinstance(kernel, int) else tuple(kernel)
        return nn.Conv(
            features,
            k,
            strides=(stride, stride),
            padding=padding,
            use_bias=bias,
            dtype=self.dtype,
            param_dtype=wide(self.dtype),
            kernel_init=named(CONV_INIT, (None, None, in_axis, "conv_out")),
            bias_init=named(nn.initializers.zeros_init(), ("conv_out",)),
        )(x)

    def bn(self, x, train):
        """BatchNorm over the batch (synchronised over `bn_axis_name` in training), its
        statistics in one pass shifted by the running mean (models/batch_norm.py); they follow
        its scale's logical names (models/base.py logical_names). Without BatchNorm
        (batch_norm=False) the identity."""
        if not self.batch_norm:
            return x
        return BatchNorm(
            use_running_average=not train,
            momentum=0.9,
            epsilon=self.bn_epsilon,
            dtype=self.dtype,
            param_dtype=wide(self.dtype),
            axis_name=self.bn_axis_name if train else None,
            scale_init=named(nn.initializers.ones_init(), ("conv_out",)),
            bias_init=named(nn.initializers.zeros_init(), ("conv_out",)),
        )(x)

    def conv_bn(
        self, x, train, features, kernel, stride=1, padding="SAME", relu=True, in_axis="conv_in"
    ):
        x = self.bn(self.conv(x, features, kernel, stride, padding, in_axis), train)
        return nn.relu(x) if relu else x

    def flops(self, in_shape: tuple[int, ...]) -> int:
        return count_flops(self, tuple(in_shape))


class Stem(Block):
    """The first convolution: conv -> BatchNorm -> ReLU (CIFAR ResNets: 3x3, 16 channels), and
    for ImageNet ResNets a 7x7 stride-2 conv and a 3x3 stride-2 max-pool (torchvision).
    `bn_relu=False`: the conv alone, with a bias (tf_cnn_benchmarks' DenseNet)."""

    features: int = 16
    kernel: int = 3
    stride: int = 1
    pool: bool = False
    bn_relu: bool = True

    @nn.compact
    def __call__(self, x, train: bool, keys=None):
        pad = ((self.kernel // 2,) * 2,) * 2
        if not self.bn_relu:
            return self.conv(x, self.features, self.kernel, self.stride, pad, "image", bias=True)
        x = self.conv_bn(x, train, self.features, self.kernel, self.stride, pad, in_axis="image")
        if self.pool:
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        return x


class BasicBlock(Block):
    """He et al.'s two-conv residual block (v1): conv3x3(stride) -> BN -> ReLU -> conv3x3 -> BN,
    plus the shortcut, then ReLU. Where the shape changes, shortcut "A" (the CIFAR ResNets of
    He et al. and tf_cnn_benchmarks: subsample by the stride, zero-pad the new channels; no
    parameters) or "B" (a 1x1 stride conv and BN)."""

    features: int = 16
    stride: int = 1
    shortcut: str = "A"

    @nn.compact
    def __call__(self, x, train: bool, keys=None):
        y = self.conv_bn(x, train, self.features, 3, self.stride, ((1, 1), (1, 1)))
        y = self.conv_bn(y, train, self.features, 3, 1, ((1, 1), (1, 1)), relu=False)
        return nn.relu(y + self._shortcut(x, train))

    def _shortcut(self, x, train):
        if self.stride == 1 and x.shape[-1] == self.features:
            return x
        if self.shortcut == "B":
            return self.conv_bn(x, train, self.features, 1, self.stride, "VALID", relu=False)
        x = x[:, :: self.stride, :: self.stride, :]
        extra = self.features - x.shape[-1]
        return jnp.pad(x, ((0, 0), (0, 0), (0, 0), (extra // 2, extra - extra // 2)))


class Bottleneck(Block):
    """ResNet v1.5's bottleneck (torchvision): 1x1 -> BN -> ReLU -> 3x3(stride) -> BN -> ReLU ->
    1x1 (4x) -> BN, plus the shortcut (a 1x1 stride conv and BN where the shape changes), then
    ReLU. v1.5 puts the stride on the 3x3 (v1 on the first 1x1)."""

    features: int = 64  # the bottleneck width; the block outputs 4x this
    stride: int = 1

    @nn.compact
    def __call__(self, x, train: bool, keys=None):
        y = self.conv_bn(x, train, self.features, 1, 1, "VALID")
        y = self.conv_bn(y, train, self.features, 3, self.stride, ((1, 1), (1, 1)))
        y = self.conv_bn(y, train, 4 * self.features, 1, 1, "VALID", relu=False)
        short = x
        if self.stride != 1 or x.shape[-1] != 4 * self.features:
            short = self.conv_bn(x, train, 4 * self.features, 1, self.stride, "VALID", relu=False)
        return nn.relu(y + short)


class DenseLayer(Block):
    """A layer of a dense block (Huang et al., as tf_cnn_benchmarks' densenet*_k12): BN -> ReLU
    -> conv3x3 to `growth` channels, concatenated onto its input."""

    growth: int = 12

    @nn.compact
    def __call__(self, x, train: bool, keys=None):
        y = self.conv(nn.relu(self.bn(x, train)), self.growth, 3, 1, ((1, 1), (1, 1)))
        return jnp.concatenate([x, y], axis=-1)


class Transition(Block):
    """Between dense blocks: BN -> ReLU -> conv1x1 (channels kept: tf_cnn_benchmarks' DenseNet,
    no compression) -> 2x2 average pool."""

    @nn.compact
    def __call__(self, x, train: bool, keys=None):
        y = self.conv(nn.relu(self.bn(x, train)), x.shape[-1], 1, 1, "VALID")
        return nn.avg_pool(y, (2, 2), strides=(2, 2))


class PooledHead(Block):
    """The classifier of ResNets, DenseNets and Inception: (optional BN -> ReLU, the DenseNet
    ending) global average pool -> dense to the classes (float32 logits; float64 in float64
    runs: layers.wide)."""

    num_classes: int = 10
    pre_bn: bool = False

    out_axes = ("batch", "classes")

    @nn.compact
    def __call__(self, x, train: bool, keys=None):
        if self.pre_bn:
            x = nn.relu(self.bn(x, train))
        x = jnp.mean(x, axis=(1, 2))
        x = nn.Dense(
            self.num_classes,
            dtype=self.dtype,
            param_dtype=wide(self.dtype),
            kernel_init=named(DENSE_INIT, ("embed", "classes")),
            bias_init=named(nn.initializers.zeros_init(), ("classes",)),
        )(x)
        return x.astype(wide(self.dtype))
