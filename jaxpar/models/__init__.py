"""Model registry: config name -> builder of a SequentialModel."""

from __future__ import annotations

import functools

import jax.numpy as jnp

from jaxpar.models import lenet, vgg
from jaxpar.models.base import Layer, SequentialModel

NAMES = (*vgg.CONFIGS, "lenet")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

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
    return vgg.vgg(name, input_shape, num_classes, head=head, **kw)
