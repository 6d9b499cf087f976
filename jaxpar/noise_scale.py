"""The gradient noise scale of a run, from two gradient sizes every step already has.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", App. A.1): with the
squared norm of the gradient at a small batch, |G_small|^2 (the mean over the step's equal
small groups: data replicas, accumulation slices or pipeline micro-batches, each
b_small = B / groups images), and at the whole batch, |G_big|^2 (b_big = B),

    |G|^2     ~ (b_big |G_big|^2 - b_small |G_small|^2) / (b_big - b_small)
    tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1 / b_small - 1 / b_big)

are unbiased estimates of the true gradient's squared norm and of the per-example gradient
covariance's trace. Each is smoothed on its own (an exponential moving average, bias-corrected
as Adam's moments are) and the simple noise scale B_simple = tr(Sigma) / |G|^2 is their
ratio: the ratio of two noisy per-step estimates would be biased, and is often negative.

The steps report the two squared norms as scalars (`grad_sq_small`, `grad_sq_big` in a
step's metrics, parallel/norms.py); this module turns them into figures on the host.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from jaxpar.run_spec import DEFAULTS
from jaxpar.summary_record import NoiseScaleFigures


def unbiased(sq_small: float, sq_big: float, b_small: float, b_big: float) -> tuple[float, float]:
    """(|G|^2, tr(Sigma)) estimated from one step's two squared norms (App. A.1)."""
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got {b_small} and {b_big}")
    g2 = (b_big * sq_big - b_small * sq_small) / (b_big - b_small)
    trace = (sq_small - sq_big) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace


def ratio(trace: float, g2: float) -> float:
    """B_simple from (smoothed or averaged) estimates; nan where |G|^2 is not positive yet."""
    return trace / g2 if g2 > 0 else math.nan


@dataclasses.dataclass
class NoiseScale:
    """Smoothed |G|^2 and tr(Sigma) over a run's steps, and their run averages.

    `decay` is the moving average's weight on the past (0.95: about the last 20 steps)."""

    b_small: float
    b_big: float
    decay: float = DEFAULTS.noise_scale_decay
    _ema_g2: float = 0.0
    _ema_trace: float = 0.0
    _count: int = 0
    # every step's (step, |G|^2, tr(Sigma)) estimate, for the run's averages
    history: list[tuple[int, float, float]] = dataclasses.field(default_factory=list)

    def add(self, step: int, sq_small: float, sq_big: float) -> dict[str, float]:
        """One step's norms in; that step's record out: the raw estimates and the smoothed
        figures after it."""
        g2, trace = unbiased(sq_small, sq_big, self.b_small, self.b_big)
        norms = {"grad_sq_small": float(sq_small), "grad_sq_big": float(sq_big)}
        return norms | self._estimates(step, g2, trace)

    def _estimates(self, step: int, g2: float, trace: float) -> dict[str, float]:
        """One step's unbiased estimates in; the smoothed figures after it out."""
        self.history.append((int(step), g2, trace))
        self._count += 1
        self._ema_g2 = self.decay * self._ema_g2 + (1 - self.decay) * g2
        self._ema_trace = self.decay * self._ema_trace + (1 - self.decay) * trace
        return {
            "grad_sq_est": g2,
            "grad_trace_est": trace,
            "grad_sq_smoothed": self.smoothed_g2,
            "grad_trace_smoothed": self.smoothed_trace,
            "noise_scale": _finite(self.smoothed),
        }

    def replay(self, records: Iterable[dict]) -> None:
        """Continue from a resumed run's per-step records (metrics.jsonl "noise" lines), from
        the estimates each recorded: the batch sizes they were taken at may have been others
        (a goodput schedule moves the batch)."""
        for r in sorted(records, key=lambda r: r["step"]):
            self._estimates(r["step"], r["grad_sq_est"], r["grad_trace_est"])

    @property
    def smoothed_g2(self) -> float:
        return self._ema_g2 / (1 - self.decay**self._count) if self._count else math.nan

    @property
    def smoothed_trace(self) -> float:
        return self._ema_trace / (1 - self.decay**self._count) if self._count else math.nan

    @property
    def smoothed(self) -> float:
        """B_simple from the smoothed estimates after the last step."""
        return ratio(self.smoothed_trace, self.smoothed_g2) if self._count else math.nan

    def average(self, until: int | None = None, since: int = 0) -> float:
        """B_simple over steps since < step <= until: the ratio of the two estimates' means
        (the run's average; every step weighs the same)."""
        rows = [(g, t) for s, g, t in self.history if since < s and (until is None or s <= until)]
        if not rows:
            return math.nan
        return ratio(sum(t for _, t in rows) / len(rows), sum(g for g, _ in rows) / len(rows))

    def summary(self, until: int | None = None) -> NoiseScaleFigures:
        """The summary's figures: the run's average B_simple (and up to `until`, the step a
        target was reached, when given), the last smoothed value, and the two batch sizes."""
        return NoiseScaleFigures(
            noise_scale=_finite(self.average()),
            noise_scale_last=_finite(self.smoothed),
            noise_scale_b_small=self.b_small,
            noise_scale_b_big=self.b_big,
            noise_scale_steps=len(self.history),
            noise_scale_to_target=_finite(self.average(until)) if until is not None else None,
            to_target=until is not None,
        )


def _finite(value: float) -> float | None:
    """None for a figure not defined yet (|G|^2 not positive): metrics.jsonl stays JSON."""
    return value if math.isfinite(value) else None
