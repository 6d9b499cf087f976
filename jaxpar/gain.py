"""AdaScale's gain and Pollux's statistical efficiency, from the gradient noise scale.

At scale S = B / B0 (B the global batch, B0 the base batch the learning rate is set for),
with |G|^2 the true gradient's squared norm and tr(Sigma) the per-example gradient
covariance's trace (noise_scale.py estimates both), the gradient variance at B0 is
sigma^2 = tr(Sigma) / B0 and AdaScale's gain (Johnson, Agarwal and Wegman, ICML 2020) is

    r = (sigma^2 + |G|^2) / (sigma^2 / S + |G|^2) = (1 + B_noise / B0) / (1 + B_noise / B)

with B_noise = tr(Sigma) / |G|^2 the simple noise scale: between 1 and S (between S and 1
for S < 1). A step at batch B with the rate r x lr makes the progress of r steps at B0.
Pollux's statistical efficiency (Qiao et al., OSDI 2021) is that progress per example
relative to B0's, r / S.

`gain` takes the two estimates (host floats or traced scalars); `gain_at` takes B_noise.
An estimate of |G|^2 that is not positive (early, or noise) reads as all noise (r = S), as
AdaptDL's clipping does; a trace that is not positive reads as no noise (r = 1).
"""

from __future__ import annotations

import math

import jax.numpy as jnp


def gain(g2, trace, base_batch: float, batch: float):
    """AdaScale's gain at `batch` over `base_batch` from |G|^2 and tr(Sigma) (either may be
    a traced scalar; the result is then one too). Exactly 1 where batch == base_batch."""
    g2, trace = jnp.maximum(g2, 0.0), jnp.maximum(trace, 0.0)
    at_base, at_batch = trace / base_batch, trace / batch
    total = at_base + g2
    return jnp.where(total > 0, total / jnp.where(total > 0, at_batch + g2, 1.0), 1.0)


def gain_at(noise_scale: float, base_batch: float, batch: float) -> float:
    """The gain from B_noise: (1 + B_noise / B0) / (1 + B_noise / B); an infinite or
    undefined B_noise (|G|^2 not positive) gives B / B0."""
    if noise_scale is None or math.isnan(noise_scale) or math.isinf(noise_scale):
        return batch / base_batch
    noise = max(float(noise_scale), 0.0)
    return (1 + noise / base_batch) / (1 + noise / batch)


def efficiency(noise_scale: float, base_batch: float, batch: float) -> float:
    """Pollux's statistical efficiency: the progress per example at `batch` relative to
    `base_batch`'s, gain / scale (1 at the base batch, falling towards B0 / B as B grows
    past B_noise)."""
    return gain_at(noise_scale, base_batch, batch) * base_batch / batch
