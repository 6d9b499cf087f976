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

from jaxpar.models.blocks import AdaptivePool, AlexConv
from jaxpar.models.layers import DenseBlock
from jaxpar.models.resnet import sequential
from jaxpar.models.vgg import scaled

NAMES = ("alexnet",)


def alexnet(input_shape: tuple[int, int, int], num_classes: int, *, width: float = 1.0,
            dtype: Any = None, dropout: bool = False):  # fmt: skip
    kw = {} if dtype is None else {"dtype": dtype}
    c = lambda n: scaled(n, width)
    rate = 0.5 if dropout else 0.0
    if min(input_shape[:2]) >= 224:
        blocks = [
            ("conv1", AlexConv(features=c(64), kernel=11, stride=4, padding=((2, 2), (2, 2)),
                               pool=3, in_axis="image", **kw)),
            ("conv2", AlexConv(features=c(192), kernel=5, padding=((2, 2), (2, 2)), pool=3, **kw)),
            ("conv3", AlexConv(features=c(384), kernel=3, padding=((1, 1), (1, 1)), **kw)),
            ("conv4", AlexConv(features=c(256), kernel=3, padding=((1, 1), (1, 1)), **kw)),
            ("conv5", AlexConv(features=c(256), kernel=3, padding=((1, 1), (1, 1)), pool=3, **kw)),
            ("pool", AdaptivePool(size=6, dropout=rate, **kw)),
        ]  # fmt: skip
        hidden = (c(4096), c(4096))
    else:
        blocks = [
            ("conv1", AlexConv(features=c(64), kernel=5, pool=3, pool_padding="SAME",
                               lrn="after_pool", in_axis="image", **kw)),
            ("conv2", AlexConv(features=c(64), kernel=5, pool=3, pool_padding="SAME",
                               lrn="before_pool", **kw)),
        ]  # fmt: skip
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
