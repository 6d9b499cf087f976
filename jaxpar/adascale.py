"""AdaScale SGD (Johnson, Agarwal and Wegman, ICML 2020) as an optax transformation.

`scale_by_adascale` takes the place of optax's `scale_by_learning_rate` at the end of an
optimizer's chain. Each step it is handed the step's two squared gradient norms (the noise
scale's, `GradNoise`), turns them into the unbiased estimates of |G|^2 and tr(Sigma)
(noise_scale.unbiased), smooths each with a bias-corrected moving average, and scales the
update by

    -lr(progress) x r,     r = the gain at scale S = B / B0 (jaxpar/gain.py)

where lr is the run's schedule read at the scale-invariant progress rather than at the step
count, and progress advances by r each step. At S = 1 the gain is exactly 1, the progress is
the step count and the update is optax's own, bit for bit.

Its state (the two averages, the progress and the last gain) is part of the optimizer state,
so it is checkpointed, placed on any mesh and resumed with the rest. The gain is taken from
the estimates including the step's own (as AdaptDL does), so every partitioning computes it
from the same two scalars the step already reduces: only scalar work is added.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxpar import gain as gain_lib
from jaxpar.noise_scale import unbiased


class GradNoise(NamedTuple):
    """A step's two squared gradient norms and the batch sizes they were taken at (the
    sizes are Python numbers: fixed for a compiled step)."""

    sq_small: jax.Array  # mean over the small groups of each group's gradient's squared norm
    sq_big: jax.Array  # the combined gradient's squared norm
    b_small: float  # images in a small group
    b_big: float  # the global batch


class AdaScaleState(NamedTuple):
    """The moving averages (biased; `count` corrects them), the progress (a compensated
    float32 sum: `carry` holds what the sum lost), and the last step's gain and rate."""

    count: jax.Array  # int32: steps averaged
    ema_g2: jax.Array
    ema_trace: jax.Array
    progress: jax.Array  # scale-invariant steps done: the sum of the gains
    carry: jax.Array  # Kahan compensation of `progress`
    gain: jax.Array  # the gain of the last step (1 before the first)
    rate: jax.Array  # the learning rate the last step applied: lr(progress) x gain


def scale_by_adascale(
    schedule: optax.Schedule, base_batch: int, decay: float
) -> optax.GradientTransformationExtraArgs:
    """The learning rate at the progress, times AdaScale's gain; `base_batch` is B0 (the batch
    the schedule's rates are meant for) and `decay` the moving averages' weight on the past.
    `update` needs the keyword argument `noise` (a GradNoise)."""

    def init(params) -> AdaScaleState:
        del params
        zero = jnp.zeros((), jnp.float32)
        return AdaScaleState(jnp.zeros((), jnp.int32), zero, zero, zero, zero, zero + 1, zero)

    def update(updates, state: AdaScaleState, params=None, *, noise: GradNoise | None = None):
        del params
        if noise is None:
            raise ValueError("scale_by_adascale needs the step's gradient norms (noise=)")
        g2, trace = unbiased(noise.sq_small, noise.sq_big, noise.b_small, noise.b_big)
        count = state.count + 1
        ema_g2 = decay * state.ema_g2 + (1 - decay) * g2
        ema_trace = decay * state.ema_trace + (1 - decay) * trace
        corrected = 1 - jnp.asarray(decay, jnp.float32) ** count
        r = gain_lib.gain(ema_g2 / corrected, ema_trace / corrected, base_batch, noise.b_big)
        rate = (schedule(state.progress) * r).astype(jnp.float32)
        updates = jax.tree.map(lambda u: jnp.asarray(-rate, u.dtype) * u, updates)
        progress, carry = _kahan_add(state.progress, state.carry, r)
        new = AdaScaleState(count, ema_g2, ema_trace, progress, carry, r, rate)
        return updates, new

    return optax.GradientTransformationExtraArgs(init, update)


def _kahan_add(total: jax.Array, carry: jax.Array, value: jax.Array):
    """total + value in float32 with Kahan's compensation: exact for integer steps (gain 1),
    and within one rounding of the true sum however long the run."""
    y = value - carry
    t = total + y
    return t, (t - total) - y


def find(opt_state: Any) -> AdaScaleState | None:
    """The AdaScale state inside an optimizer state (a chain's tuple of states), or None."""
    if isinstance(opt_state, AdaScaleState):
        return opt_state
    if isinstance(opt_state, tuple):
        for part in opt_state:
            if (found := find(part)) is not None:
                return found
    return None
