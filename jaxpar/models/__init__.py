"""Model registry: config name -> builder of a SequentialModel."""

from __future__ import annotations

import functools

import jax.numpy as jnp

from jaxpar.models import alexnet, densenet, inception, lenet, resnet, vgg
from jaxpar.models.base import Layer, SequentialModel

NAMES = (*vgg.CONFIGS, "lenet", *resnet.NAMES, *densenet.NAMES, *alexnet.NAMES, *inception.NAMES)
# float64 is for numerical checks (tests compare partitionings in it where float32 rounding
# grows chaotically); it needs JAX's 64-bit mode (JAX_ENABLE_X64=1).
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float64": jnp.float64}

__all__ = ["NAMES", "Layer", "SequentialModel", "build"]


def build(model_config, input_shape: tuple[int, int, int], num_classes: int) -> SequentialModel:
    """Build the model named in `model_config` for a dataset's input shape and classes."""
    return _build(
        model_config.name,
        tuple(input_shape),
        int(num_classes),
        float(model_config.width),
        bool(model_config.batch_norm),
        model_config.dtype,
        model_config.get("head", "auto"),
        bool(model_config.get("dropout", False)),
    )


@functools.lru_cache(maxsize=32)
def _build(name, input_shape, num_classes, width, batch_norm, dtype, head, dropout):
    kw = {"width": width, "batch_norm": batch_norm, "dtype": DTYPES[dtype]}
    if name == "lenet":
        return lenet.lenet(input_shape, num_classes, dropout=dropout, **kw)
    if name in vgg.CONFIGS:
        return vgg.vgg(name, input_shape, num_classes, head=head, **kw)
    # These families have BatchNorm exactly where the originals do; batch_norm=False removes it.
    if name in resnet.NAMES:
        return resnet.resnet(name, input_shape, num_classes, **kw)
    if name in densenet.NAMES:
        return densenet.densenet(name, input_shape, num_classes, **kw)
    if name == "alexnet":
        kw.pop("batch_norm")  # the original has none
        return alexnet.alexnet(input_shape, num_classes, dropout=dropout, **kw)
    return inception.inception_v3(input_shape, num_classes, **kw)
