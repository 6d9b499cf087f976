"""`--validate`'s suites: a suite's rows predicted on a fitted profile beside their published or
measured references (`suite_lines`: efficiency points against published multi-device tables;
median error and rank correlation against the rows measured here, beside the measurement's own
repeats), and the targets each check is read against (report.py reports them per profile)."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

from jaxpar import configfile
from jaxpar.predict import PredictedRow, load_profile, predict_config, predict_rows, with_references
from jaxpar.stats import spearman
from jaxpar.suites import load_rows


@dataclasses.dataclass(frozen=True)
class Figures:
    """A profile's validation figures, None where not checked: the worst |error| of a model
    left out (two or more models left), the worst efficiency difference in points against a
    published table, and the median |error| and rank correlation against rows measured here."""

    single: float | None = None
    points: float | None = None
    median: float | None = None
    rank: float | None = None


TARGETS = Figures(single=0.15, points=5.0, median=0.10, rank=0.8)


_PREDICTED: dict = {}  # (profile file, a config's JSON) -> its predicted row, for one run


def forget() -> None:
    """Drop the rows and profiles predicted so far (a new validation run reads them again)."""
    _PREDICTED.clear()


def suite_rows(
    profile_path: str, suite: str, say: Callable[[str], None] | None = None
) -> list[PredictedRow]:
    """A suite's rows predicted on the (fully fitted) profile, with their references; a row
    another of the profile's suites already predicted (two clouds' tables of the same runs)
    is not predicted again (`say`: a progress line per row)."""

    if ("profile", profile_path) not in _PREDICTED:
        _PREDICTED["profile", profile_path] = load_profile(profile_path)
    profile = _PREDICTED["profile", profile_path]

    def predict(config, profile, overlap):
        key = (profile_path, config.to_json(sort_keys=True))
        if key not in _PREDICTED:
            _PREDICTED[key] = predict_config(config, profile, overlap)
        return _PREDICTED[key]

    configs = load_rows(None, suite, {})
    rows = predict_rows(
        [(name, config) for name, config, _ in configs], profile, None, predict, say=say
    )
    return with_references(rows, [ref for _, _, ref in configs])


def mark(ok: bool) -> str:
    return "meets" if ok else "MISSES"


def suite_lines(path: str, suite: str, figures: Figures, say=None) -> tuple[list[str], Figures]:
    """A suite's report lines, and `figures` with what its rows measure."""
    if say is not None:
        say(f"{suite}: predicting its rows")
    rows = [r for r in suite_rows(path, suite, say) if r.ok]
    head = "| row | predicted img/s | reference img/s | error | predicted eff. | reference eff. "
    lines = [f"{suite}:", "", head + "| points |", "|---|---|---|---|---|---|---|"]
    errors, pred, meas, points = [], [], [], []
    for r in rows:
        ref, eff = r.reference_images_per_sec, r.reference_efficiency
        err = r.images_per_sec / ref - 1 if ref else None
        pt = 100 * (r.efficiency - eff) if eff and r.efficiency is not None else None
        if err is not None:
            errors.append(abs(err))
            pred.append(r.images_per_sec)
            meas.append(ref)
        if pt is not None and r.num_devices > 1:
            points.append(abs(pt))
        mine = r.efficiency
        cells = [
            f"{ref:,.1f}" if ref else "-",
            f"{100 * err:+.1f}%" if err is not None else "-",
            f"{100 * mine:.1f}%" if mine else "-",
            f"{100 * eff:.1f}%" if eff else "-",
            f"{pt:+.1f}" if pt is not None else "-",
        ]
        lines.append(f"| {r.name} | {r.images_per_sec:,.1f} | " + " | ".join(cells) + " |")
    spec = configfile.load(suite)
    here = bool(spec.get("measured_here", False))
    if points and not here:
        worst = max(points)
        figures = dataclasses.replace(figures, points=max(worst, figures.points or 0.0))
        within = sum(p <= TARGETS.points for p in points)
        lines.append(
            f"\nworst efficiency difference: {worst:.1f} points "
            f"({mark(worst <= TARGETS.points)} the 5-point target); {within} of "
            f"{len(points)} multi-device rows within 5 points"
        )
    if len(errors) >= 3 and here:  # measured on this machine: the median and the ranking
        med, rank = statistics.median(errors), spearman(meas, pred)
        figures = dataclasses.replace(figures, median=med, rank=rank)
        constant = statistics.median(meas)
        base = statistics.median(abs(constant / m - 1) for m in meas)
        lines.append(
            f"\nimages/sec against measured: median |error| {100 * med:.1f}% "
            f"({mark(med <= TARGETS.median)} 10%), rank correlation {rank:.3f} "
            f"({mark(rank >= TARGETS.rank)} 0.8) over {len(errors)} rows; the "
            f"baseline (every row at the median measured images/sec): median |error| "
            f"{100 * base:.1f}%, no ranking"
        )
        lines += repeat_line(spec, [r.name for r in rows if r.reference_images_per_sec])
    return lines, figures


def repeat_line(spec, names: list[str]) -> list[str]:
    """How far the measurement agrees with itself over the rows `names`, where the suite
    keeps each row's repeats (`repeats`: (name, first, second)): the scale the median and the
    ranking are read on."""
    rates = {name: (a, b) for name, a, b in spec.get("repeats", ()) or ()}
    pairs = [rates[n] for n in names if n in rates]
    if len(pairs) < 3:
        return []
    first, second = [a for a, _ in pairs], [b for _, b in pairs]
    diff = statistics.median(abs(a / b - 1) for a, b in pairs)
    line = (
        f"the measurement's own two repeats over {len(pairs)} of these rows: rank "
        f"correlation {spearman(first, second):.2f}, median difference {100 * diff:.1f}%"
    )
    return [line]
