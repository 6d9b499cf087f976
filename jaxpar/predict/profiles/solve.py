"""The predictor's solver of fitted constants: named positive constants solved for within their
bounds, and which of them ended at a bound reported (the fit wanted more than the model allows,
so the errors it leaves say less than they seem to).

`least_squares` solves continuous constants in log space by scipy's least squares of
residuals, from one or more starts; `grid` picks the best of a bounded list of candidates (a
width measured in steps); `root` finds where a decreasing function of one constant crosses a
target by bisection in log space; `nonnegative` solves linear costs, none below 0. Every
fitter in predict (fitting, kernels, micro, device_rates, pipelinehost) calls one of them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

AT_BOUND = 1e-4  # in log space: within this of an upper bound is at it


@dataclasses.dataclass(frozen=True)
class Solution:
    values: dict[str, float]
    cost: float  # what the solver minimised (half the sum of squares for least_squares)
    at_bound: tuple[str, ...] = ()


def least_squares(
    residuals: Callable[[dict[str, float]], Any],
    start: dict[str, float],
    upper: dict[str, float] | None = None,
    shifts: Sequence[float] = (0.0,),
) -> Solution:
    """The constants (`start`'s names, each positive) that minimise the sum of squared
    `residuals(values)`, each at most its `upper` (none: unbounded), solved in log space from
    `start` shifted by each of `shifts` (log factors; a start beyond a bound is set just below
    it); the best of those solutions."""
    # imported here: the largest import `python -m jaxpar.predict` would pay at start-up
    # (`python -X importtime -m jaxpar.predict --help`), needed only where a fit runs
    from scipy import optimize

    names = tuple(start)
    x0 = np.array([np.log(start[n]) for n in names])
    top = np.array([np.log((upper or {}).get(n, np.inf)) for n in names])

    def at(x) -> dict[str, float]:
        return {n: float(np.exp(v)) for n, v in zip(names, x)}

    tries = [
        optimize.least_squares(
            lambda x: residuals(at(x)), np.minimum(x0 + d, top - 1e-6), bounds=(-np.inf, top)
        )
        for d in shifts
    ]
    best = min(tries, key=lambda t: t.cost)
    bound = tuple(n for n, x, t in zip(names, best.x, top) if x >= t - AT_BOUND)
    return Solution(at(best.x), float(best.cost), bound)


def grid(
    name: str, candidates: Sequence[float], cost: Callable[[float], float], tol: float = 0.0
) -> Solution:
    """The candidate of least `cost` (the first of those within `tol` of it), at its bound
    when it is the first or the last candidate."""
    best, least = candidates[0], cost(candidates[0])
    for c in candidates[1:]:
        if (err := cost(c)) < least - tol:
            best, least = c, err
    edge = (name,) if best in (candidates[0], candidates[-1]) else ()
    return Solution({name: best}, least, edge)


def root(
    name: str, decreasing: Callable[[float], float], target: float, lo: float, hi: float
) -> Solution:
    """The value between exp(lo) and exp(hi) where `decreasing(value)` falls to `target`: 60
    bisections in log space, the upper end of the last interval; at its bound when that is
    exp(hi) itself. A `decreasing(exp(hi))` above the target raises ValueError: no root."""
    if decreasing(math.exp(hi)) > target:
        raise ValueError(f"{name}: no value up to {math.exp(hi):g} reaches {target:g}")
    a, b = lo, hi
    for _ in range(60):
        mid = (a + b) / 2
        a, b = (mid, b) if decreasing(math.exp(mid)) > target else (a, mid)
    value = math.exp(b)
    return Solution({name: value}, abs(decreasing(value) - target), (name,) * (b == hi))


def nonnegative(names: Sequence[str], features, target) -> Solution:
    """Linear costs `names` (one per column of `features`) that fit `target` best in least
    squares, none below 0: a negative one is dropped and the rest solved again; a column
    never used, or dropped, is 0 (at its bound)."""
    features, target = np.asarray(features, float), np.asarray(target, float)
    keep = [i for i in range(len(names)) if features[:, i].any()]
    while True:
        coef, *_ = np.linalg.lstsq(features[:, keep], target, rcond=None)
        if (coef >= 0).all():
            break
        keep.pop(int(np.argmin(coef)))
    values = dict.fromkeys(names, 0.0)
    values.update({names[i]: float(c) for i, c in zip(keep, coef)})
    residual = target - features[:, keep] @ coef
    return Solution(
        values, float(residual @ residual) / 2, tuple(n for n in names if not values[n])
    )
