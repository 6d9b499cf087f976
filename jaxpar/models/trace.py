"""One layer's forward program on one example, traced abstractly (no arrays, no compile).

A model's static costs (output shape, parameter count, FLOPs) and the spatial axis' halo
rules are read from this program. It depends only on the module's fields and the input
shape, and deep models repeat a few kinds of block many times (ResNet-152: 52 layers, 10
distinct), so each distinct (module, input shape) is traced once per process.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.extend.core import ClosedJaxpr


class Traced(NamedTuple):
    """A layer's variables as shapes (boxed with their logical names, as flax creates them)
    and its forward program in inference mode on a batch of one."""

    variables: Any
    jaxpr: ClosedJaxpr

    @property
    def out_shape(self) -> tuple[int, ...]:
        """The output's shape per example."""
        return tuple(self.jaxpr.out_avals[0].shape[1:])


def traced(module: nn.Module, in_shape: tuple[int, ...]) -> Traced:
    """`module`'s forward program on one example of `in_shape` (from the cache when a module
    with the same fields was traced on that shape before)."""
    in_shape = tuple(in_shape)
    try:
        hash(module)
    except TypeError:  # a field that cannot be hashed (a list, say): traced every time
        return _trace(module, in_shape)
    return _cached(module, in_shape, jax.config.jax_enable_x64)


@functools.lru_cache(maxsize=2048)
def _cached(module: nn.Module, in_shape: tuple[int, ...], x64: bool) -> Traced:
    """`_trace`, one entry per x64 setting too: float64 parameters are float64 only where x64
    is on (jax.enable_x64)."""
    return _trace(module, in_shape)


def _trace(module: nn.Module, in_shape: tuple[int, ...]) -> Traced:
    x = jax.ShapeDtypeStruct((1, *in_shape), jnp.float32)
    variables = jax.eval_shape(lambda a: module.init(jax.random.key(0), a, train=False), x)
    jaxpr = jax.make_jaxpr(lambda v, a: module.apply(v, a, train=False))(variables, x)
    return Traced(variables, jaxpr)
