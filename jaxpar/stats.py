"""Rank statistics shared by the bench (predicted beside measured) and the predictor's
validation."""

from __future__ import annotations

import math


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation of paired `xs` and `ys`: the Pearson correlation of their
    ranks, tied values sharing the average of their ranks. None with fewer than two pairs or
    when either side is constant (no ranking to compare)."""
    if len(xs) != len(ys):
        raise ValueError(f"spearman: {len(xs)} xs against {len(ys)} ys")
    if len(xs) < 2:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def _ranks(values: list[float]) -> list[float]:
    """1-based ranks; a run of equal values gets the mean of the ranks it spans."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks
