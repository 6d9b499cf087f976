"""ResNets (He et al. 2016) as cuttable residual blocks.

CIFAR (`resnet20/32/44/56/110`, 6n+2 layers): a 3x3 stem of 16 channels, three stages of n
basic blocks of 16/32/64 channels (the 2nd and 3rd start with stride 2), global average pool and
one dense layer. Shortcut option A where the shape changes (stride subsampling and zero-padded
channels, no parameters: He et al.'s CIFAR choice and tf_cnn_benchmarks'), so resnet20 has
269,722 parameters (the paper's 0.27M). ImageNet (`resnet50`, `resnet152`, v1.5: the stride on
the 3x3 of the bottleneck, as torchvision): a 7x7/2 stem and 3x3/2 max-pool, four stages of
bottlenecks of width 64/128/256/512 (outputs x4), projection shortcuts: 25,557,032 and
60,192,808 parameters at 1000 classes. `width` scales every channel count.
"""

from __future__ import annotations

from typing import Any

from jaxpar.models.base import SequentialModel, make_layer
from jaxpar.models.blocks import BasicBlock, Bottleneck, PooledHead, Stem
from jaxpar.models.vgg import scaled

CIFAR = {"resnet20": 3, "resnet32": 5, "resnet44": 7, "resnet56": 9, "resnet110": 18}
IMAGENET = {"resnet50": (3, 4, 6, 3), "resnet152": (3, 8, 36, 3)}
NAMES = (*CIFAR, *IMAGENET)


def resnet(
    name: str,
    input_shape: tuple[int, int, int],
    num_classes: int,
    *,
    width: float = 1.0,
    batch_norm: bool = True,
    dtype: Any = None,
) -> SequentialModel:
    kw: dict[str, Any] = {"batch_norm": batch_norm}
    if dtype is not None:
        kw["dtype"] = dtype
    blocks: list[tuple[str, Any]] = []
    if name in CIFAR:
        blocks.append(("stem", Stem(features=scaled(16, width), **kw)))
        for stage, channels in enumerate((16, 32, 64), 1):
            for i in range(CIFAR[name]):
                stride = 2 if stage > 1 and i == 0 else 1
                block = BasicBlock(features=scaled(channels, width), stride=stride, **kw)
                blocks.append((f"res{stage}_{i + 1}", block))
    else:
        blocks.append(
            ("stem", Stem(features=scaled(64, width), kernel=7, stride=2, pool=True, **kw))
        )
        for stage, (count, channels) in enumerate(zip(IMAGENET[name], (64, 128, 256, 512)), 1):
            for i in range(count):
                stride = 2 if stage > 1 and i == 0 else 1
                block = Bottleneck(features=scaled(channels, width), stride=stride, **kw)
                blocks.append((f"res{stage}_{i + 1}", block))
    blocks.append(("head", PooledHead(num_classes=num_classes, **kw)))
    return sequential(name, blocks, input_shape, num_classes)


def sequential(name, blocks, input_shape, num_classes) -> SequentialModel:
    """A SequentialModel of named blocks, each a Layer with its shapes and costs."""
    layers, shape = [], tuple(input_shape)
    for layer_name, block in blocks:
        layers.append(make_layer(layer_name, block, shape))
        shape = layers[-1].out_shape
    return SequentialModel(name, tuple(layers), tuple(input_shape), num_classes)
