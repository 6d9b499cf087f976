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

from jaxpar.errors import ConfigError
from jaxpar.models.blocks import Inception, InceptionStem, PooledHead
from jaxpar.models.resnet import sequential

NAMES = ("inception_v3",)


def inception_v3(input_shape: tuple[int, int, int], num_classes: int, *, width: float = 1.0,
                 batch_norm: bool = True, dtype: Any = None):  # fmt: skip
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
    modules += [(f"mixed5{x}", Inception(kind="A", pool_features=p, **kw))
                for x, p in zip("bcd", (32, 64, 64))]  # fmt: skip
    modules.append(("mixed6a", Inception(kind="B", **kw)))
    modules += [(f"mixed6{x}", Inception(kind="C", c7=c7, **kw))
                for x, c7 in zip("bcde", (128, 160, 160, 192))]  # fmt: skip
    modules.append(("mixed7a", Inception(kind="D", **kw)))
    modules += [(f"mixed7{x}", Inception(kind="E", **kw)) for x in "bc"]
    head = {k: v for k, v in kw.items() if k != "width"}
    modules.append(("head", PooledHead(num_classes=num_classes, **head)))
    return sequential("inception_v3", modules, input_shape, num_classes)
