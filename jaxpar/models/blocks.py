"""Blocks of the source documents' other models: residual blocks (basic and bottleneck), stems,
dense-net layers and transitions, Inception modules, AlexNet's stages, and pooled heads. Each is
one cuttable unit of a SequentialModel: a pipeline cuts between blocks, never inside one, so a
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
import jax
import jax.numpy as jnp
from jax import lax

from jaxpar.errors import ConfigError
from jaxpar.models.layers import CONV_INIT, DENSE_INIT, dropout, named, wide


def count_flops(module: nn.Module, in_shape: tuple[int, ...]) -> int:
    """Forward FLOPs per example of `module` on one example of `in_shape`: 2 x the
    multiply-adds of every convolution and matmul in its traced program (inference mode)."""
    x = jax.ShapeDtypeStruct((1, *in_shape), jnp.float32)
    variables = jax.eval_shape(lambda a: module.init(jax.random.key(0), a, train=False), x)
    jaxpr = jax.make_jaxpr(lambda v, a: module.apply(v, a, train=False))(variables, x)
    return 2 * _macs(jaxpr.jaxpr)


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
            features, k, strides=(stride, stride), padding=padding, use_bias=bias,
            dtype=self.dtype, param_dtype=wide(self.dtype),
            kernel_init=named(CONV_INIT, (None, None, in_axis, "conv_out")),
            bias_init=named(nn.initializers.zeros_init(), ("conv_out",)),
        )(x)  # fmt: skip

    def bn(self, x, train):
        """BatchNorm over the batch (synchronised over `bn_axis_name` in training); its
        statistics follow its scale's logical names (models/base.py logical_names). The
        variance is computed in two passes: E[x^2] - E[x]^2 cancels catastrophically where a
        channel's mean is large against its spread (deep blocks on small maps), and then every
        partitioning's different summation order trains a different model. Without BatchNorm
        (batch_norm=False) the identity."""
        if not self.batch_norm:
            return x
        return nn.BatchNorm(
            use_running_average=not train, momentum=0.9, epsilon=self.bn_epsilon,
            dtype=self.dtype, param_dtype=wide(self.dtype),
            axis_name=self.bn_axis_name if train else None,
            use_fast_variance=False,  # two passes: E[(x - mean)^2] does not cancel
            scale_init=named(nn.initializers.ones_init(), ("conv_out",)),
            bias_init=named(nn.initializers.zeros_init(), ("conv_out",)),
        )(x)  # fmt: skip

    def conv_bn(self, x, train, features, kernel, stride=1, padding="SAME", relu=True,
                in_axis="conv_in"):  # fmt: skip
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
            self.num_classes, dtype=self.dtype, param_dtype=wide(self.dtype),
            kernel_init=named(DENSE_INIT, ("embed", "classes")),
            bias_init=named(nn.initializers.zeros_init(), ("classes",)),
        )(x)  # fmt: skip
        return x.astype(wide(self.dtype))


def lrn(x, depth_radius=4, bias=1.0, alpha=0.001 / 9.0, beta=0.75):
    """TensorFlow's local response normalisation across channels (tf.nn.lrn)."""
    window = 2 * depth_radius + 1
    sq = lax.reduce_window(x * x, 0.0, lax.add, (1, 1, 1, window), (1, 1, 1, 1),
                           ((0, 0), (0, 0), (0, 0), (depth_radius, depth_radius)))  # fmt: skip
    return x / (bias + alpha * sq) ** beta


class AlexConv(Block):
    """One convolutional stage of an AlexNet: conv (with bias, no BatchNorm) -> ReLU, then
    optionally LRN and a max-pool (order as in the variant: `lrn_first`)."""

    features: int = 64
    kernel: int = 5
    stride: int = 1
    padding: Any = "SAME"
    pool: int = 0  # 0: none; else a `pool`x`pool` stride-2 max-pool
    pool_padding: Any = "VALID"
    lrn: str = ""  # "", "before_pool" or "after_pool"
    in_axis: str = "conv_in"

    @nn.compact
    def __call__(self, x, train: bool, keys=None):
        x = nn.relu(self.conv(x, self.features, self.kernel, self.stride, self.padding,
                              self.in_axis, bias=True))  # fmt: skip
        if self.lrn == "before_pool":
            x = lrn(x)
        if self.pool:
            x = nn.max_pool(x, (self.pool, self.pool), strides=(2, 2), padding=self.pool_padding)
        if self.lrn == "after_pool":
            x = lrn(x)
        return x


class AdaptivePool(Block):
    """torchvision's AdaptiveAvgPool2d to `size` x `size` (equal bins where the input divides,
    as at 224x224 where AlexNet's features are already 6x6)."""

    size: int = 6

    @nn.compact
    def __call__(self, x, train: bool, keys=None):
        h, w = x.shape[1:3]
        if (h, w) != (self.size, self.size):
            if h % self.size or w % self.size:
                raise ConfigError(
                    f"the input gives {h}x{w} feature maps, which do not pool evenly to "
                    f"{self.size}x{self.size}; use an input whose maps divide (224x224 for "
                    "alexnet; below 224 it builds the CIFAR AlexNet instead)"
                )
            k = (h // self.size, w // self.size)
            x = nn.avg_pool(x, k, strides=k)
        return dropout(x, self.dropout, keys) if train and self.dropout else x  # torchvision's

    def flops(self, in_shape):
        return 0


def _bn_conv(block: Block, x, train, features, kernel, stride=1, padding="SAME"):
    """Inception's BasicConv2d (torchvision): conv without bias -> BN (epsilon 1e-3) -> ReLU."""
    return block.conv_bn(x, train, features, kernel, stride, padding)


class InceptionStem(Block):
    """Inception-v3's stem at 299x299 (torchvision): 3x3/2 32, 3x3 32, 3x3 64 (padded),
    max-pool 3x3/2, 1x1 80, 3x3 192, max-pool 3x3/2 -> 35x35x192 (channels x `width`)."""

    width: float = 1.0

    @nn.compact
    def __call__(self, x, train: bool, keys=None):
        c = lambda n: max(1, round(n * self.width))
        x = self.conv_bn(x, train, c(32), 3, 2, "VALID", in_axis="image")
        x = _bn_conv(self, x, train, c(32), 3, 1, "VALID")
        x = _bn_conv(self, x, train, c(64), 3, 1, ((1, 1), (1, 1)))
        x = nn.max_pool(x, (3, 3), strides=(2, 2))
        x = _bn_conv(self, x, train, c(80), 1, 1, "VALID")
        x = _bn_conv(self, x, train, c(192), 3, 1, "VALID")
        return nn.max_pool(x, (3, 3), strides=(2, 2))


class Inception(Block):
    """The Inception-v3 modules (torchvision's InceptionA..E), each one cuttable unit: the
    branches are concatenated inside it. `kind` picks the module; `pool_features` is A's pool
    branch width, `c7` C's 7x7 width; `width` scales every branch's channels."""

    kind: str = "A"
    pool_features: int = 32
    c7: int = 128
    width: float = 1.0

    def c(self, n: int) -> int:
        return max(1, round(n * self.width))

    @nn.compact
    def __call__(self, x, train: bool, keys=None):
        return jnp.concatenate(getattr(self, f"_{self.kind.lower()}")(x, train), axis=-1)

    def _pool(self, x):
        return nn.avg_pool(x, (3, 3), strides=(1, 1), padding=((1, 1), (1, 1)),
                           count_include_pad=True)  # fmt: skip

    def _a(self, x, t):
        c, f = self.c, lambda *a: _bn_conv(self, *a)
        b1 = f(x, t, c(64), 1)
        b5 = f(f(x, t, c(48), 1), t, c(64), 5)
        b3 = f(f(f(x, t, c(64), 1), t, c(96), 3), t, c(96), 3)
        bp = f(self._pool(x), t, c(self.pool_features), 1)
        return [b1, b5, b3, bp]

    def _b(self, x, t):
        c, f = self.c, lambda *a: _bn_conv(self, *a)
        b3 = f(x, t, c(384), 3, 2, "VALID")
        bd = f(f(f(x, t, c(64), 1), t, c(96), 3), t, c(96), 3, 2, "VALID")
        return [b3, bd, nn.max_pool(x, (3, 3), strides=(2, 2))]

    def _c(self, x, t):
        c, f, c7 = self.c, lambda *a: _bn_conv(self, *a), self.c(self.c7)
        b1 = f(x, t, c(192), 1)
        b7 = f(f(f(x, t, c7, 1), t, c7, (1, 7)), t, c(192), (7, 1))
        bd = x
        for out, k in ((c7, 1), (c7, (7, 1)), (c7, (1, 7)), (c7, (7, 1)), (c(192), (1, 7))):
            bd = f(bd, t, out, k)
        return [b1, b7, bd, f(self._pool(x), t, c(192), 1)]

    def _d(self, x, t):
        c, f = self.c, lambda *a: _bn_conv(self, *a)
        b3 = f(f(x, t, c(192), 1), t, c(320), 3, 2, "VALID")
        b7 = f(f(f(x, t, c(192), 1), t, c(192), (1, 7)), t, c(192), (7, 1))
        b7 = f(b7, t, c(192), 3, 2, "VALID")
        return [b3, b7, nn.max_pool(x, (3, 3), strides=(2, 2))]

    def _e(self, x, t):
        c, f = self.c, lambda *a: _bn_conv(self, *a)
        b1 = f(x, t, c(320), 1)
        b3 = f(x, t, c(384), 1)
        b3 = [f(b3, t, c(384), (1, 3)), f(b3, t, c(384), (3, 1))]
        bd = f(f(x, t, c(448), 1), t, c(384), 3)
        bd = [f(bd, t, c(384), (1, 3)), f(bd, t, c(384), (3, 1))]
        return [b1, *b3, *bd, f(self._pool(x), t, c(192), 1)]
