"""Model registry: config name -> builder of a SequentialModel.

`model.name` is one of NAMES, or the import path of a builder of your own, "package.module:fn":
`fn(model_config, input_shape, num_classes)` returns either an ordinary flax.linen.Module
whose `__call__(x, train)` gives logits (tests/example_flax.py; models/flax_module.py wraps
it), or a SequentialModel of jaxpar's layer interface (tests/example_model.py: layers made
with `make_layer`, each a flax module like layers.ConvBlock). Every partitioning then splits
it without editing jaxpar.
"""

from __future__ import annotations

import functools
import importlib

import flax.linen as nn
import jax.numpy as jnp

from jaxpar.errors import ConfigError
from jaxpar.models import alexnet, densenet, flax_module, inception, lenet, resnet, vgg
from jaxpar.models.base import Layer, SequentialModel
from jaxpar.run_spec import DEFAULTS

NAMES = (*vgg.CONFIGS, "lenet", *resnet.NAMES, *densenet.NAMES, *alexnet.NAMES, *inception.NAMES)
# float64 is for numerical checks (tests compare partitionings in it where float32 rounding
# grows chaotically); it needs JAX's 64-bit mode (JAX_ENABLE_X64=1).
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float64": jnp.float64}

__all__ = ["NAMES", "Layer", "SequentialModel", "build", "check_name", "is_import_path"]


def is_import_path(name: str) -> bool:
    """Whether a model name is a builder's import path ("package.module:fn")."""
    return ":" in name


def check_name(name: str) -> str | None:
    """Why `name` names no model (one line), or None."""
    if not is_import_path(name):
        if name in NAMES:
            return None
        return (
            f"unknown model.name {name!r}; choose one of {', '.join(NAMES)}, or give the "
            "import path of a builder of your own (package.module:fn)"
        )
    try:
        _builder(name)
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        return f"model.name {name!r}: cannot import the builder ({type(e).__name__}: {e})"
    return None


def _builder(path: str):
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError("write it as package.module:fn")
    fn = getattr(importlib.import_module(module), attr)
    if not callable(fn):
        raise TypeError(f"{attr} is not callable")
    return fn


def build(model_config, input_shape: tuple[int, int, int], num_classes: int) -> SequentialModel:
    """Build the model named in `model_config` (a registered name, or a builder's import path)
    for a dataset's input shape and classes."""
    if is_import_path(model_config.name):
        return _build_external(
            model_config.name, model_config, tuple(input_shape), int(num_classes)
        )
    return _build(
        model_config.name,
        tuple(input_shape),
        int(num_classes),
        float(model_config.width),
        bool(model_config.batch_norm),
        model_config.dtype,
        model_config.get("head", DEFAULTS.model.head),
        bool(model_config.get("dropout", DEFAULTS.model.dropout)),
    )


def _build_external(name, model_config, input_shape, num_classes) -> SequentialModel:
    if (reason := check_name(name)) is not None:
        raise ConfigError(reason)
    key = (name, input_shape, num_classes, repr(sorted(model_config.items())))
    if key not in _EXTERNAL:
        model = _builder(name)(model_config, input_shape, num_classes)
        if isinstance(model, nn.Module):
            model = flax_module.from_module(
                model,
                name,
                input_shape,
                num_classes,
                layers_attr=str(model_config.get("layers", DEFAULTS.model.layers)),
                param_rules=tuple(model_config.get("param_rules", DEFAULTS.model.param_rules)),
                dtype=DTYPES[model_config.dtype],
            )
        if not isinstance(model, SequentialModel):
            raise ConfigError(
                f"model.name {name!r} returned {type(model).__name__}, not a flax.linen.Module "
                "or a jaxpar.models.SequentialModel"
            )
        _EXTERNAL[key] = model
    return _EXTERNAL[key]


# Built once per name, input, classes and model settings, as the registry's models are (a
# pipeline's stages and the analysis ask for the same model again).
_EXTERNAL: dict = {}


def forget_built() -> None:
    """Drop every model built so far: the next `build` builds afresh (after a family's table of
    depths or modules has changed)."""
    _build.cache_clear()
    _EXTERNAL.clear()


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
