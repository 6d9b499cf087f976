"""Goodput (Pollux, Qiao et al., OSDI 2021): which batch, on which mesh, makes the most progress
per second now, given the gradient noise scale now and each setup's step time.

Under AdaScale a step at global batch B makes the progress of r(B) steps at the base batch B0
(gain.py), so a setup's rate of progress is

    r(B, B_noise) / step_time(setup)        [base-batch steps per second]

which is Pollux's goodput, throughput x statistical efficiency, divided by B0. As B_noise grows
over training the best batch grows with it: `choose` picks the best setup for the B_noise of
the moment. `StepTimes` gives a setup's step time: measured where it has run, otherwise from
a fit of time = fixed + per-image x B over the batches its mesh has run (one measured batch:
time proportional to the batch), or from a given function (a hardware profile's predictions).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence

from jaxpar.target import gain as gain_lib


@dataclasses.dataclass(frozen=True, order=True)
class Setup:
    """One way to run a step: the global batch, the mesh and the accumulation slices."""

    batch: int
    mesh_shape: tuple[int, ...]
    accum: int = 1

    def describe(self) -> str:
        mesh = ",".join(str(s) for s in self.mesh_shape)
        slices = f" in {self.accum} slices" if self.accum > 1 else ""
        return f"batch {self.batch} on ({mesh}){slices}"


def progress_rate(step_s: float, batch: int, base_batch: int, noise_scale: float) -> float:
    """Base-batch steps of progress per second at `batch` with this step time."""
    return gain_lib.gain_at(noise_scale, base_batch, batch) / step_s


class StepTimes:
    """Step times of setups: measured medians where a setup has run, else estimated from its
    mesh's measured batches, else `predict(setup)` (seconds) when given."""

    def __init__(self, predict: Callable[[Setup], float] | None = None):
        self.predict = predict
        self.measured: dict[Setup, float] = {}

    def record(self, setup: Setup, times: Sequence[float]) -> None:
        """A setup's step times (warm steps only): their median is its time from now on."""
        if times:
            self.measured[setup] = float(statistics.median(times))

    def of(self, setup: Setup) -> float | None:
        """The setup's step time in seconds, or None where nothing is known of its mesh."""
        if setup in self.measured:
            return self.measured[setup]
        if self.predict is not None:
            return self.predict(setup)
        same = [(s.batch, t) for s, t in self.measured.items() if s.mesh_shape == setup.mesh_shape]
        if not same:
            return None
        fixed, per_image = _fit(same)
        return fixed + per_image * setup.batch

    def source(self, setup: Setup) -> str:
        if setup in self.measured:
            return "measured"
        return "predicted" if self.predict is not None else "fitted"


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """time = fixed + per_image x batch by least squares over (batch, time) points, both terms
    kept non-negative; one point (or one batch): proportional to the batch."""
    batches = {b for b, _ in points}
    if len(batches) < 2:
        b, t = points[0]
        return 0.0, t / b
    n = len(points)
    mb = sum(b for b, _ in points) / n
    mt = sum(t for _, t in points) / n
    slope = sum((b - mb) * (t - mt) for b, t in points) / sum((b - mb) ** 2 for b, _ in points)
    slope = max(slope, 0.0)
    fixed = mt - slope * mb
    if fixed < 0:  # no fixed cost: the proportional fit through the origin
        return 0.0, sum(t * b for b, t in points) / sum(b * b for b, _ in points)
    return fixed, slope


@dataclasses.dataclass(frozen=True)
class Choice:
    """A decision: the best setup, and every candidate's step time and rate of progress."""

    best: Setup
    noise_scale: float
    rates: dict[Setup, float]  # base-batch steps of progress per second
    step_s: dict[Setup, float]

    def line(self, current: Setup) -> str:
        """The decision in one line."""
        rate, now = self.rates[self.best], self.rates.get(current)
        gain = f", {rate / now:.2f}x the progress per second of {current.describe()}" if now else ""
        return (
            f"goodput: {self.best.describe()} at B_noise {self.noise_scale:,.0f} "
            f"({rate:.1f} steps of progress per second{gain})"
        )


def choose(
    candidates: Sequence[Setup], times: StepTimes, base_batch: int, noise_scale: float
) -> Choice:
    """The candidate with the most progress per second at this noise scale (candidates with no
    step time known are left out; ties go to the smaller batch)."""
    step_s = {c: t for c in candidates if (t := times.of(c)) is not None and t > 0}
    if not step_s:
        raise ValueError("no candidate has a step time: run one of them first")
    rates = {c: progress_rate(t, c.batch, base_batch, noise_scale) for c, t in step_s.items()}
    best = max(sorted(rates), key=lambda c: rates[c])
    return Choice(best, noise_scale, rates, step_s)


@dataclasses.dataclass(frozen=True)
class Simulated:
    """A run simulated over a noise trace: its phases, steps and seconds to the progress."""

    phases: tuple[tuple[int, Setup], ...]  # (first step, setup)
    steps: int
    seconds: float
    reached: bool


def simulate(
    noise_at: Callable[[float], float],
    progress_to: float,
    base_batch: int,
    step_s: Callable[[Setup], float],
    candidates: Sequence[Setup],
    every: int,
    fixed: Setup | None = None,
    max_steps: int = 10**7,
) -> Simulated:
    """Steps and seconds to make `progress_to` steps of progress, B_noise following the
    reference's trace as a function of progress (`noise_at`), step times from `step_s`: at a
    `fixed` setup, or choosing the best candidate by goodput every `every` steps."""
    times = StepTimes(predict=step_s)
    progress, seconds, steps = 0.0, 0.0, 0
    phases: list[tuple[int, Setup]] = []
    setup = fixed
    while progress < progress_to and steps < max_steps:
        if fixed is None and steps % every == 0:
            best = choose(candidates, times, base_batch, noise_at(progress)).best
            if best != setup:
                phases.append((steps, best))
                setup = best
        elif not phases:
            phases.append((0, setup))
        progress += gain_lib.gain_at(noise_at(progress), base_batch, setup.batch)
        seconds += step_s(setup)
        steps += 1
    return Simulated(tuple(phases), steps, seconds, progress >= progress_to - 1e-9)


def interpolate(points: Sequence[tuple[float, float]]) -> Callable[[float], float]:
    """A function of x through (x, y) points: linear between them, constant beyond; an
    infinite or undefined y (no estimate yet) is all noise, and stays so."""
    xs = [x for x, _ in points]
    ys = [y for _, y in points]

    def at(x: float) -> float:
        if not points:
            return math.inf
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1]
        hi = next(i for i, v in enumerate(xs) if v >= x)
        lo = hi - 1
        if not (math.isfinite(ys[lo]) and math.isfinite(ys[hi])):
            return ys[lo] if not math.isfinite(ys[lo]) else ys[hi]
        w = (x - xs[lo]) / (xs[hi] - xs[lo])
        return ys[lo] + w * (ys[hi] - ys[lo])

    return at
