"""Inception-v3 (Szegedy et al. 2016) at 299x299 as torchvision builds it, without the
auxiliary head: the stem (to 35x35x192), InceptionA x3 (pool branches 32, 64, 64), B, C x4 (7x7
widths 128, 160, 160, 192), D, E x2, global average pool and dense. Each module is one cuttable
unit (its branches are concatenated inside it). BatchNorm as torchvision's BasicConv2d: scale
and offset, epsilon 1e-3 (Keras' InceptionV3 has no BatchNorm scale, hence its 23,817,352
trainable parameters); this one has 23,834,568 at 1000 classes. `width` scales every channel
count. Inputs must be at least 75x75 (the stem and the two stride-2 modules need it).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxpar.errors import ConfigError
from jaxpar.models.blocks import Block, PooledHead
from jaxpar.models.resnet import sequential

NAMES = ("inception_v3",)


def inception_v3(
    input_shape: tuple[int, int, int],
    num_classes: int,
    *,
    width: float = 1.0,
    batch_norm: bool = True,
    dtype: Any = None,
):
    if min(input_shape[:2]) < 75:
        raise ConfigError(
            f"inception_v3 needs inputs of at least 75x75 pixels, got "
            f"{input_shape[0]}x{input_shape[1]}; use data.name=synthetic with "
            f"data.image_shape='(299,299,3)' (or a CIFAR model: resnet20, densenet40)"
        )
    kw: dict[str, Any] = {"bn_epsilon": 1e-3, "width": width, "batch_norm": batch_norm}
    if dtype is not None:
        kw["dtype"] = dtype
    modules = [("stem", InceptionStem(**kw))]
    modules += [
        (f"mixed5{x}", Inception(kind="A", pool_features=p, **kw))
        for x, p in zip("bcd", (32, 64, 64))
    ]
    modules.append(("mixed6a", Inception(kind="B", **kw)))
    modules += [
        (f"mixed6{x}", Inception(kind="C", c7=c7, **kw))
        for x, c7 in zip("bcde", (128, 160, 160, 192))
    ]
    modules.append(("mixed7a", Inception(kind="D", **kw)))
    modules += [(f"mixed7{x}", Inception(kind="E", **kw)) for x in "bc"]
    head = {k: v for k, v in kw.items() if k != "width"}
    modules.append(("head", PooledHead(num_classes=num_classes, **head)))
    return sequential("inception_v3", modules, input_shape, num_classes)


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
        return nn.avg_pool(
            x, (3, 3), strides=(1, 1), padding=((1, 1), (1, 1)), count_include_pad=True
        )

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
