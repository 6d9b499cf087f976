"""DenseNets for CIFAR (Huang et al. 2017) as tf_cnn_benchmarks builds `densenet40_k12` and
`densenet100_k12` (seed 003's table): a 3x3 conv of 16 channels (with bias, no BatchNorm), three
dense blocks of (depth - 4) / 3 layers (BN -> ReLU -> 3x3 conv of growth 12, concatenated),
transitions that keep the channel count (BN -> ReLU -> 1x1 conv -> 2x2 average pool; no
bottleneck, no compression), then BN -> ReLU -> global average pool -> dense. Each dense layer
and each transition is one cuttable unit: a concatenation never crosses a stage boundary.
densenet40 has 1,019,738 parameters and densenet100 6,979,658 (the paper's 1.0M and 7.0M).
`width` scales the stem and the growth rate.
"""

from __future__ import annotations

from typing import Any

from jaxpar.models.blocks import DenseLayer, PooledHead, Stem, Transition
from jaxpar.models.resnet import sequential
from jaxpar.models.vgg import scaled

DEPTHS = {"densenet40": 40, "densenet100": 100}
NAMES = tuple(DEPTHS)


def densenet(
    name: str,
    input_shape: tuple[int, int, int],
    num_classes: int,
    *,
    width: float = 1.0,
    growth: int = 12,
    batch_norm: bool = True,
    dtype: Any = None,
):
    kw: dict[str, Any] = {"batch_norm": batch_norm}
    if dtype is not None:
        kw["dtype"] = dtype
    per_block = (DEPTHS[name] - 4) // 3
    k = scaled(growth, width)
    blocks: list[tuple[str, Any]] = [
        ("stem", Stem(features=scaled(16, width), bn_relu=False, **kw))
    ]
    for b in range(1, 4):
        blocks += [(f"dense{b}_{i + 1}", DenseLayer(growth=k, **kw)) for i in range(per_block)]
        if b < 3:
            blocks.append((f"transition{b}", Transition(**kw)))
    blocks.append(("head", PooledHead(num_classes=num_classes, pre_bn=True, **kw)))
    return sequential(name, blocks, input_shape, num_classes)
