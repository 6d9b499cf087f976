"""BatchNorm whose batch statistics take one pass over the input: the mean and the mean square
reduced together (one fusion on a GPU, one message where the statistics are synchronised),
each taken after subtracting the running mean.

E[x^2] - E[x]^2 on the raw input cancels where a channel's mean is large against its spread
(deep blocks on small maps), and then two programs that sum in different orders (two
partitionings) normalise differently. Shifted by a per-channel constant c, the same formula
gives the same variance in exact arithmetic, and its rounding error is that of
E[(x - c)^2] - E[x - c]^2: small once c is near the batch's mean, which the running mean is
after the first steps of training. c is the running mean held in the state, so every device,
micro-batch and partitioning shifts by the same value, and no gradient flows through it.

The module has flax.linen.BatchNorm's variables, names and initial values (params `scale`,
`bias`; batch_stats `mean`, `var` in float32), its momentum convention and its biased batch
variance, so checkpoints and partitioning rules read it as they read flax's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


class BatchNorm(nn.Module):
    """BatchNorm over every axis but the last (the channels). `axis_name`: the mesh axis (or
    axes) whose devices' statistics are averaged in training, as flax's."""

    use_running_average: bool
    momentum: float = 0.9
    epsilon: float = 1e-5
    dtype: Any = None
    param_dtype: Any = jnp.float32
    axis_name: Any = None
    scale_init: Callable = nn.initializers.ones_init()
    bias_init: Callable = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, x):
        channels = (x.shape[-1],)
        ra_mean = self.variable("batch_stats", "mean", jnp.zeros, channels, jnp.float32)
        ra_var = self.variable("batch_stats", "var", jnp.ones, channels, jnp.float32)
        if self.use_running_average:
            mean, var = ra_mean.value, ra_var.value
        else:
            mean, var = self._batch_statistics(x, ra_mean.value)
            if not self.is_initializing():
                keep = self.momentum
                ra_mean.value = keep * ra_mean.value + (1 - keep) * mean
                ra_var.value = keep * ra_var.value + (1 - keep) * var
        scale = self.param("scale", self.scale_init, channels, self.param_dtype)
        bias = self.param("bias", self.bias_init, channels, self.param_dtype)
        mul = jax.lax.rsqrt(var + self.epsilon) * scale
        y = (x - mean) * mul + bias
        dtype = self.dtype or jnp.result_type(x, scale)
        return jnp.asarray(y, dtype)

    def _batch_statistics(self, x, shift):
        """The batch's mean and (biased) variance per channel, in at least float32: the mean
        and mean square of x - shift, reduced in one pass and averaged over `axis_name` in one
        collective. Without `axis_name`, by `local_statistics`, whose gradient does not read
        the shift."""
        wide = jnp.promote_types(self.dtype or x.dtype, jnp.float32)
        shift = jax.lax.stop_gradient(shift).astype(wide)
        if self.axis_name is None:
            return local_statistics(x.astype(wide), shift)
        m1, m2 = jax.lax.pmean(jnp.stack(_moments(x.astype(wide) - shift)), self.axis_name)
        return _statistics(shift, m1, m2)


def _moments(centred: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The mean and mean square of `centred` over every axis but the last."""
    axes = tuple(range(centred.ndim - 1))
    return centred.mean(axes), jnp.square(centred).mean(axes)


def _statistics(shift, m1, m2) -> tuple[jax.Array, jax.Array]:
    """(mean, biased variance) from the moments of x - shift."""
    return shift + m1, jnp.maximum(0.0, m2 - jnp.square(m1))


@jax.custom_vjp
def local_statistics(x: jax.Array, shift: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(mean, variance) over every axis of x but the last, from the moments of x - shift.

    Its gradient is the statistics' own, d mean / dx = 1/n and d var / dx = 2 (x - mean) / n,
    in which the shift cancels: the backward reads the batch's mean, not the shift (the
    running mean, which the step overwrites in its donated buffer), so XLA keeps no copy of
    the old running mean for it (one kernel fewer per BatchNorm in one GPU's step:
    docs/predict.md, "BatchNorm in one pass", by benchmarks/gpu_programs.py). The synchronised
    statistics keep JAX's own gradient."""
    return _statistics(shift, *_moments(x - shift))


def _local_statistics_fwd(x, shift):
    mean, var = local_statistics(x, shift)
    # zeros typed as the shift (its varying mesh axes included): the shift's cotangent
    return (mean, var), (x, mean, jnp.zeros_like(shift))


def _local_statistics_bwd(residuals, cotangents):
    x, mean, no_shift = residuals
    d_mean, d_var = cotangents
    n = x.size // x.shape[-1]
    # The variance's clip at 0 (rounding only: m2 < m1^2 where x - mean is ~0) is passed over.
    return (d_mean + 2.0 * d_var * (x - mean)) / n, no_shift


local_statistics.defvjp(_local_statistics_fwd, _local_statistics_bwd)
