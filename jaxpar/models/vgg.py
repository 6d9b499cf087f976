"""VGG 11/13/16/19 (configurations A, B, D, E of Simonyan & Zisserman) as cuttable layers.

CIFAR head: the conv stack then one dense layer to the classes (as in pytorch-classification's
vgg19_bn). ImageNet head: three dense layers (4096, 4096, classes) on 224x224 input. Dropout is
left out so every partitioning computes a deterministic, comparable function.
"""

from __future__ import annotations

from typing import Any

from jaxpar.errors import ConfigError
from jaxpar.models.base import SequentialModel, make_layer
from jaxpar.models.layers import ConvBlock, DenseBlock

# Channels per conv; "M" is a 2x2 max-pool, fused into the conv block before it.
# fmt: off
CONFIGS = {
    "vgg11": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg13": (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg16": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
              512, 512, 512, "M"),
    "vgg19": (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
              512, 512, 512, 512, "M"),
}
# fmt: on


def scaled(channels: int, width: float) -> int:
    return max(1, round(channels * width))


def vgg(
    name: str,
    input_shape: tuple[int, int, int],
    num_classes: int,
    *,
    width: float = 1.0,
    batch_norm: bool = False,
    head: str = "auto",
    dtype: Any = None,
) -> SequentialModel:
    """Build VGG `name` for `input_shape` (H, W, C); head "auto" picks ImageNet at >= 224px."""
    cfg = CONFIGS[name]
    if head == "auto":
        head = "imagenet" if min(input_shape[:2]) >= 224 else "cifar"
    pools = sum(1 for c in cfg if c == "M")
    if min(input_shape[:2]) < 2**pools:
        raise ConfigError(
            f"{name} halves the image {pools} times and needs inputs of at least "
            f"{2**pools}x{2**pools} pixels, got {input_shape[0]}x{input_shape[1]}; "
            "use a 32x32 dataset (shapes10, cifar10) or model.name=lenet"
        )
    kw = {} if dtype is None else {"dtype": dtype}
    layers, shape, n = [], tuple(input_shape), 0
    for i, c in enumerate(cfg):
        if c == "M":
            continue
        n += 1
        pool = i + 1 < len(cfg) and cfg[i + 1] == "M"
        in_axis = "image" if n == 1 else "conv_in"  # image channels (3) are never split
        block = ConvBlock(scaled(c, width), batch_norm=batch_norm, pool=pool, in_axis=in_axis, **kw)
        layers.append(make_layer(f"conv{n}", block, shape))
        shape = layers[-1].out_shape
    if head == "imagenet":
        hidden = scaled(4096, width)
        # Logical feature names: fc1 "embed"->"mlp" (column-parallel under the default rules),
        # fc2 "mlp"->"hidden" (row-parallel), fc3 "hidden"->"classes".
        dense = [
            DenseBlock(hidden, in_axis="embed", out_axis="mlp", **kw),
            DenseBlock(hidden, in_axis="mlp", out_axis="hidden", **kw),
        ]
    elif head == "cifar":
        dense = []
    else:
        raise ConfigError(f"unknown model.head {head!r}; use cifar, imagenet or auto")
    last_in = "hidden" if dense else "embed"
    dense.append(DenseBlock(num_classes, relu=False, in_axis=last_in, out_axis="classes", **kw))
    for j, block in enumerate(dense, 1):
        layers.append(make_layer(f"fc{j}", block, shape))
        shape = layers[-1].out_shape
    return SequentialModel(name, tuple(layers), tuple(input_shape), num_classes)
