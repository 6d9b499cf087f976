"""Goodput (Pollux, Qiao et al., OSDI 2021): which batch, on which mesh, makes the most progress
per second now, given the gradient noise scale now and each setup's step time.

Under AdaScale a step at global batch B makes the progress of r(B) steps at the base batch B0
(jaxpar/gain.py), so a setup's rate of progress is

    r(B, B_noise) / step_time(setup)        [base-batch steps per second]

which is Pollux's goodput, throughput x statistical efficiency, divided by B0. As B_noise grows
over training the best batch grows with it: `choose` picks the best setup for the B_noise of
the moment. `StepTimes` gives a setup's step time: measured where it has run, from a given
function (a hardware profile's predictions), or from a fit over the batches its mesh has run;
a setup nothing is known of is tried one neighbour at a time (StepTimes.estimate).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence

from jaxpar import gain as gain_lib
from jaxpar.target.steps import TracePoint


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
    """Step times of setups: measured medians where a setup has run; for the others, `predict`
    (a hardware profile's predictions) when given, else a fit of time = fixed + per-image x B
    over the batches their mesh has run (two or more), else an optimistic guess that gets a
    setup tried once (`estimate`)."""

    def __init__(self, predict: Callable[[Setup], float] | None = None):
        self.predict = predict
        self.measured: dict[Setup, float] = {}

    def record(self, setup: Setup, times: Sequence[float]) -> None:
        """A setup's step times (warm steps only): their median is its time from now on."""
        if times:
            self.measured[setup] = float(statistics.median(times))

    def of(self, setup: Setup) -> float | None:
        """The setup's step time in seconds, or None where it is not known yet."""
        if setup in self.measured:
            return self.measured[setup]
        if self.predict is not None:
            return self.predict(setup)
        same = [(s.batch, t) for s, t in self.measured.items() if s.mesh_shape == setup.mesh_shape]
        if len({b for b, _ in same}) < 2:
            return None
        fixed, per_image = _fit(same)
        return fixed + per_image * setup.batch

    def estimate(
        self, setup: Setup, candidates: Sequence[Setup], current: Setup
    ) -> tuple[float, str] | None:
        """(seconds, where the figure comes from) for choosing among `candidates` from
        `current`, or None where the setup is not to be tried yet. A setup not run is tried
        one neighbour at a time: the next batch below or above those its mesh has run (at the
        fit's time, or, with one batch run, optimistically: proportional below, the same time
        above), or the current batch on a mesh not run yet (at a shade under the current
        time). So the schedule walks towards the best setup and measures as it goes."""
        if setup in self.measured:
            return self.measured[setup], "measured"
        if self.predict is not None:
            return self.predict(setup), "predicted"
        mine = sorted(s.batch for s in self.measured if s.mesh_shape == setup.mesh_shape)
        if not mine:
            if setup.batch != current.batch or current not in self.measured:
                return None
            return 0.99 * self.measured[current], "to try"
        batches = sorted({c.batch for c in candidates if c.mesh_shape == setup.mesh_shape})
        at = batches.index(setup.batch)
        below, above = batches[at - 1] if at else None, batches[at + 1 : at + 2]
        if not (below == mine[-1] or (above and above[0] == mine[0])):
            return None
        fitted = self.of(setup)
        if fitted is not None:
            return fitted, "fitted"
        near = next(s for s in self.measured if s.mesh_shape == setup.mesh_shape)
        seconds = self.measured[near]
        if setup.batch < near.batch:
            seconds *= setup.batch / near.batch
        return seconds, "to try"


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
    sources: dict[Setup, str] = dataclasses.field(default_factory=dict)  # of each step time

    def line(self, current: Setup) -> str:
        """The decision in one line."""
        rate, now = self.rates[self.best], self.rates.get(current)
        gain = f", {rate / now:.2f}x the progress per second of {current.describe()}" if now else ""
        return (
            f"goodput: {self.best.describe()} at B_noise {self.noise_scale:,.0f} "
            f"({rate:.1f} steps of progress per second{gain})"
        )


def choose(
    candidates: Sequence[Setup],
    times: StepTimes,
    base_batch: int,
    noise_scale: float,
    current: Setup | None = None,
) -> Choice:
    """The candidate with the most progress per second at this noise scale, among those with a
    step time known or to be tried from `current` (StepTimes.estimate); ties go to the
    smaller batch."""
    current = current or candidates[0]
    known = {c: times.estimate(c, candidates, current) for c in candidates}
    step_s = {c: e[0] for c, e in known.items() if e is not None and e[0] > 0}
    if not step_s:
        raise ValueError("no candidate has a step time: run one of them first")
    rates = {c: progress_rate(t, c.batch, base_batch, noise_scale) for c, t in step_s.items()}
    best = max(sorted(rates), key=lambda c: rates[c])
    sources = {c: known[c][1] for c in step_s}
    return Choice(best, noise_scale, rates, step_s, sources)


@dataclasses.dataclass(frozen=True)
class Simulated:
    """A run simulated along a reference's noise trace: its phases, steps and seconds to the
    reference's progress."""

    phases: tuple[tuple[int, Setup], ...]  # (steps done when it took over, setup)
    steps: float
    seconds: float


def simulate(
    trace: Sequence[TracePoint],
    base_batch: int,
    step_s: Callable[[Setup], float],
    candidates: Sequence[Setup] = (),
    every: int = 50,
    fixed: Setup | None = None,
) -> Simulated:
    """Steps and seconds to make the progress of a reference's `trace` (steps.TracePoint:
    each reference step's B_noise and progress), at a `fixed` setup or choosing the best
    candidate by goodput every `every` steps, step times from `step_s`. Each reference step's
    progress costs progress / gain steps of the current setup (steps.steps_along's sum, so a
    fixed setup takes exactly the steps model's steps); a decision reads the B_noise of the
    reference step the run has come to."""
    times = StepTimes(predict=step_s)
    steps, seconds, due = 0.0, 0.0, 0.0
    phases: list[tuple[int, Setup]] = [] if fixed is None else [(0, fixed)]
    setup = fixed
    for point in trace:
        if fixed is None and steps >= due:
            best = choose(candidates, times, base_batch, point.noise_scale, setup).best
            if best != setup:
                phases.append((round(steps), best))
                setup = best
            while due <= steps:
                due += every
        taken = point.progress / gain_lib.gain_at(point.noise_scale, base_batch, setup.batch)
        steps += taken
        seconds += taken * step_s(setup)
    return Simulated(tuple(phases), steps, seconds)
