"""AlexNet, by input size. At 224x224 and above, torchvision's (the single-tower variant of
"One weird trick", 61,100,840 parameters at 1000 classes): five convs with ReLU (11x11/4 64,
5x5 192, 3x3 384, 256, 256; 3x3/2 max-pools after the 1st, 2nd and 5th), a 6x6 adaptive average
pool, and dense 4096 -> 4096 -> classes, with dropout 0.5 before the first two when
model.dropout is on. Below 224, tf_cnn_benchmarks' CIFAR AlexNet (seed 003's table): 5x5 conv 64
-> 3x3/2 max-pool -> LRN -> 5x5 conv 64 -> LRN -> 3x3/2 max-pool -> dense 384 -> 192 -> classes
(1,756,426 parameters at 10 classes). No BatchNorm in either (the originals have none).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
from jax import lax

from jaxpar.errors import ConfigError
from jaxpar.models.blocks import Block
from jaxpar.models.layers import DenseBlock, dropout
from jaxpar.models.resnet import sequential
from jaxpar.models.vgg import scaled

NAMES = ("alexnet",)


def alexnet(
    input_shape: tuple[int, int, int],
    num_classes: int,
    *,
    width: float = 1.0,
    dtype: Any = None,
    dropout: bool = False,
):
    kw = {} if dtype is None else {"dtype": dtype}
    c = lambda n: scaled(n, width)
    rate = 0.5 if dropout else 0.0
    if min(input_shape[:2]) >= 224:
        blocks = [
            (
                "conv1",
                AlexConv(
                    features=c(64),
                    kernel=11,
                    stride=4,
                    padding=((2, 2), (2, 2)),
                    pool=3,
                    in_axis="image",
                    **kw,
                ),
            ),
            ("conv2", AlexConv(features=c(192), kernel=5, padding=((2, 2), (2, 2)), pool=3, **kw)),
            ("conv3", AlexConv(features=c(384), kernel=3, padding=((1, 1), (1, 1)), **kw)),
            ("conv4", AlexConv(features=c(256), kernel=3, padding=((1, 1), (1, 1)), **kw)),
            ("conv5", AlexConv(features=c(256), kernel=3, padding=((1, 1), (1, 1)), pool=3, **kw)),
            ("pool", AdaptivePool(size=6, dropout=rate, **kw)),
        ]
        hidden = (c(4096), c(4096))
    else:
        blocks = [
            (
                "conv1",
                AlexConv(
                    features=c(64),
                    kernel=5,
                    pool=3,
                    pool_padding="SAME",
                    lrn="after_pool",
                    in_axis="image",
                    **kw,
                ),
            ),
            (
                "conv2",
                AlexConv(
                    features=c(64), kernel=5, pool=3, pool_padding="SAME", lrn="before_pool", **kw
                ),
            ),
        ]
        hidden, rate = (c(384), c(192)), 0.0
    blocks += [
        (
            "fc1",
            DenseBlock(
                hidden[0], in_axis="embed", out_axis="mlp", dropout=rate, he_init=True, **kw
            ),
        ),
        ("fc2", DenseBlock(hidden[1], in_axis="mlp", out_axis="hidden", he_init=True, **kw)),
        ("fc3", DenseBlock(num_classes, relu=False, in_axis="hidden", out_axis="classes", **kw)),
    ]
    return sequential("alexnet", blocks, input_shape, num_classes)


def lrn(x, depth_radius=4, bias=1.0, alpha=0.001 / 9.0, beta=0.75):
    """TensorFlow's local response normalisation across channels (tf.nn.lrn)."""
    window = 2 * depth_radius + 1
    sq = lax.reduce_window(
        x * x,
        0.0,
        lax.add,
        (1, 1, 1, window),
        (1, 1, 1, 1),
        ((0, 0), (0, 0), (0, 0), (depth_radius, depth_radius)),
    )
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
        x = nn.relu(
            self.conv(
                x, self.features, self.kernel, self.stride, self.padding, self.in_axis, bias=True
            )
        )
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
