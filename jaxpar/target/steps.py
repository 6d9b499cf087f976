"""The steps model: how many steps a run at global batch B needs to make the progress a
reference run made to its target, integrated along the reference's noise trace.

A step at batch B makes the progress of r(B) steps at the base batch Bb, AdaScale's gain
(jaxpar/gain.py): r = (1 + phi / Bb) / (1 + phi / B), phi the noise scale of the moment. A reference
run's step t made the progress dp_t (1 at its own batch without AdaScale, its gain with it) at
the noise scale phi_t, so the same progress at batch B takes

    S(B) = sum over the reference's steps t to its target of dp_t / r(B, phi_t)

phi_t is the reference's smoothed B_simple after step t (its noise line's `noise_scale`: the
ratio of the moving averages of tr(Sigma) and |G|^2, noise_scale.py), the figure AdaScale's gain
is taken from; the ratio of one step's raw estimates is biased and often negative. Where
|G|^2 is not positive yet, phi is infinite: all noise, r = B / Bb.

With phi constant this is McCandlish et al.'s S(B) = S_min (1 + B_noise / B), with
S_min = P / (1 + B_noise / Bb) for the reference's progress P (its steps without AdaScale):
`steps_one_average`, kept to show what integrating along the trace changes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from jaxpar.gain import gain_at


@dataclasses.dataclass(frozen=True)
class TracePoint:
    """One reference step: its number, the noise scale after it, the progress it made."""

    step: int
    noise_scale: float  # phi: the smoothed B_simple (math.inf while |G|^2 is not positive)
    progress: float = 1.0  # dp: its gain under AdaScale, else 1


def steps_along(trace: Sequence[TracePoint], batch: float, base_batch: float) -> float:
    """S(B): the steps at `batch` that make the trace's progress (`base_batch`: Bb)."""
    return sum(p.progress / gain_at(p.noise_scale, base_batch, batch) for p in trace)


def steps_one_average(
    progress: float, noise_scale: float, batch: float, base_batch: float
) -> float:
    """S(B) with one B_noise for the whole run: progress x (1 + B_noise / B) / (1 + B_noise /
    Bb)."""
    return progress / gain_at(noise_scale, base_batch, batch)


def interpolated(points: Sequence[tuple[int, float]], steps: int) -> list[float]:
    """Per step 1..`steps`, a value from sparse (step, value) points: linear in the step
    between two points, the first point's before it, the last's after it; a value that is not
    finite (no estimate yet) is infinite, and a step between it and a finite one takes the
    nearer point's; a negative one is 0 (no noise)."""
    pts = sorted((int(s), _finite_or_inf(v)) for s, v in points)
    out = []
    for step in range(1, steps + 1):
        if step <= pts[0][0]:
            out.append(pts[0][1])
            continue
        if step >= pts[-1][0]:
            out.append(pts[-1][1])
            continue
        hi = next(i for i, (s, _) in enumerate(pts) if s >= step)
        (s0, v0), (s1, v1) = pts[hi - 1], pts[hi]
        if math.isinf(v0) or math.isinf(v1):
            out.append(v0 if step - s0 <= s1 - step else v1)
        else:
            out.append(v0 + (step - s0) / (s1 - s0) * (v1 - v0))
    return out


def _finite_or_inf(value) -> float:
    """A trace's B_simple as the model reads it: undefined (|G|^2 not positive) is infinite,
    all noise; negative (a trace estimate below zero) is no noise."""
    if value is None or math.isnan(float(value)):
        return math.inf
    return max(float(value), 0.0)
