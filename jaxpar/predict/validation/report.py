"""`python -m jaxpar.predict --validate`: how far each profile's predictions are from figures it
was not fitted to, as a report (nothing is fitted to these checks).

For every profile (`--profile`, repeatable; default every file in configs/hardware):

1. **Leave one model out.** The profile's single-device runs (`calibration_runs`, the ones it
   is fitted to) and its `calibration_candidates` (published single-device figures of other
   models on the same device, never fitted by the shipped profile) together; for each model,
   the profile's `fit` costs are fitted on every other model's runs and the left-out model's
   images/sec predicted. Target: within 15% on every profile of two or more models.
2. **Published multi-device tables** (`validation` in the profile: suite files whose rows
   carry a published images/sec or efficiency): each row's predicted efficiency against the
   published one, in points. Target: within 5 points.
3. **Measured here** (a suite marked `measured_here` whose rows carry images/sec measured on
   this machine: configs/predict/cpu_measured.py on configs/hardware/cpu_2core.py): the median |error| of
   images/sec and the Spearman rank correlation of predicted against measured. Target: median
   at most 10%, rank correlation at least 0.8.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from jaxpar import configfile, units
from jaxpar.errors import ConfigError
from jaxpar.predict.kernels import kernel_table
from jaxpar.predict.profiles import fitting, hardware
from jaxpar.predict.profiles.calibration_runs import calibration_ops
from jaxpar.predict.profiles.records import CalibrationRun, ProfileFits
from jaxpar.predict.programs import gputarget
from jaxpar.predict.step import pricing
from jaxpar.predict.validation import suite_checks


def profiles_to_check(paths: list[str] | None) -> list[str]:
    """The profile files named (each checked before any is validated: a run of minutes does
    not stop at the last one), or every shipped one."""
    root = Path(configfile.ROOT, "configs", "hardware")
    shipped = sorted(str(p) for p in root.glob("*.py") if not p.stem.startswith("_"))
    for path in paths or ():
        if not Path(path).is_file():
            known = ", ".join(Path(p).name for p in shipped)
            raise ConfigError(f"no hardware profile {path!r}; choose one of {known}")
    return list(paths) if paths else shipped


def _spec(
    path: str,
) -> tuple[hardware.Profile, list[CalibrationRun], list[CalibrationRun], tuple, list[str]]:
    """(the profile fitted to nothing but its kernel table, its fitted runs, its candidates,
    fit names, suites)."""
    c = configfile.load(path)
    spec = ProfileFits.of_record(c)
    fitted = [*spec.calibration_runs, *([spec.calibration] if spec.calibration else [])]
    candidates, names, suites = list(spec.calibration_candidates), spec.fit, list(spec.validation)
    runs = ("calibration_runs", "calibration", "calibrations")
    kept = {k: v for k, v in c.items() if k not in runs}
    bare = fitting.from_config(kept | {"compute_efficiency": c.get("compute_efficiency") or 0.4})
    return bare, fitted, candidates, names, suites


@dataclasses.dataclass(frozen=True)
class LeftOut:
    """A run of a model left out of the fit, predicted by the costs fitted on the others."""

    run: CalibrationRun  # the calibration run, as its profile lists it
    held_out: bool  # a candidate run, never in the shipped fit
    predicted_images_per_sec: float
    error: float  # predicted / the run's images/sec - 1
    baseline_error: float  # the median of the rows fitted on, against the run
    fitted_on: list[str]  # the models fitted on
    models_left: int


def leave_one_out(
    profile: hardware.Profile,
    runs: list[tuple[CalibrationRun, bool]],
    names: tuple,
    say: Callable[[str], None] | None = None,
) -> list[LeftOut]:
    """Each model's runs (each with whether it is held out of the shipped fit) predicted by
    the `names` costs fitted on the other models' runs (`say`: a progress line per model)."""
    out, models, t0 = [], sorted({r.model for r, _ in runs}), time.perf_counter()
    for i, model in enumerate(models):
        if say is not None:
            say(
                f"leave-one-out {i + 1}/{len(models)}: fitting without {model}; elapsed "
                f"{units.clock(time.perf_counter() - t0)}"
            )
        rest = [r for r, _ in runs if r.model != model]
        if len(rest) < len(names) or not rest:
            continue
        fitted = fitting.fit(profile, rest, names).profile
        # the baseline: every row predicted at the median images/sec of the rows fitted on
        constant = statistics.median(float(o.images_per_sec) for o in rest)
        for r, held_out in ((r, h) for r, h in runs if r.model == model):
            ops = calibration_ops(r, gputarget.of(fitted))
            step = pricing.program_time(fitted, ops, r.dtype)
            step += fitted.host.step_overhead_s + fitted.host.program_overhead_s
            predicted = r.batch_size / step
            out.append(
                LeftOut(
                    run=r,
                    held_out=held_out,
                    predicted_images_per_sec=predicted,
                    error=predicted / float(r.images_per_sec) - 1,
                    baseline_error=constant / float(r.images_per_sec) - 1,
                    fitted_on=sorted({o.model for o in rest}),
                    models_left=len({o.model for o in rest}),
                )
            )
    return out


def report_profile(
    path: str, say: Callable[[str], None] | None = None
) -> tuple[list[str], suite_checks.Figures]:
    """Report lines for one profile and its figures; `say` takes progress lines."""
    profile, fitted, candidates, names, suites = _spec(path)
    title = f"## {profile.name} ({Path(path).name}; fit {', '.join(names)}; compiler "
    lines = [
        title + f"{profile.device.compiler})",
        "",
        gputarget.programs_line(gputarget.of(profile)),
        "",
    ]
    lines += [*_fit_lines(profile, fitted, names), *_kernel_lines(path, profile)]
    figures = suite_checks.Figures()
    runs = [(r, False) for r in fitted] + [(r, True) for r in candidates]
    if len({r.model for r, _ in runs}) >= 2:
        loo = leave_one_out(profile, runs, names, say)
        for held, part in ((False, "in the shipped fit"), (True, "held out (never fitted)")):
            mine = [r for r in loo if r.held_out == held]
            if not mine:
                continue
            head = f"\nrows {part}, each model left out in turn:\n\n| left out | dtype | batch"
            lines += [
                head + " | published/measured img/s | predicted | error | baseline error "
                "| fitted on |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for r in mine:
                run = r.run
                lines.append(
                    f"| {run.model} | {run.dtype} | {run.batch_size} | "
                    f"{float(run.images_per_sec):,.1f} | "
                    f"{r.predicted_images_per_sec:,.1f} | {100 * r.error:+.1f}% | "
                    f"{100 * r.baseline_error:+.1f}% | "
                    f"{'+'.join(r.fitted_on)} |"
                )
        lines.append(
            "\n(baseline: every row predicted at the median images/sec of the rows fitted on)"
        )
        counted = [abs(r.error) for r in loo]  # a profile of two or more models
        if counted:
            base = max(abs(r.baseline_error) for r in loo)
            figures = dataclasses.replace(figures, single=max(counted))
            met = suite_checks.mark(max(counted) <= suite_checks.TARGETS.single)
            lines.append(
                f"\nworst single-device error of a model left out: "
                f"{100 * max(counted):.1f}% ({met}"
                f" the 15% target; the baseline's worst: {100 * base:.1f}%)"
            )
    else:
        lines.append(f"one model in its runs ({len(runs)} run(s)): no model to leave out")
    for suite in suites:
        more, figures = suite_checks.suite_lines(path, suite, figures, say)
        lines += ["", *more]
    return lines, figures


def _fit_lines(profile: hardware.Profile, runs: list[CalibrationRun], names: tuple) -> list[str]:
    """The shipped fit's costs, and those at their bound."""
    if not runs or len(runs) < len(names):
        return []
    result = fitting.fit(profile, runs, names)
    costs = ", ".join(f"{n} {hardware.value(result.profile, n):.3g}" for n in names)
    bound = (
        f"AT ITS BOUND: {', '.join(result.at_bound)} (the fit wanted more than the model allows)"
        if result.at_bound
        else "none at a bound"
    )
    worst = max(abs(r.error) for r in result.rows)
    line = f"shipped fit on {len(runs)} run(s): {costs}; {bound}; worst fitted row "
    return [line + f"{100 * worst:.1f}%", ""]


def _kernel_lines(path: str, profile: hardware.Profile) -> list[str]:
    """Where the profile's matrix-kernel costs come from per-kernel timings
    (`kernel_benchmarks`, kernel_table.py): how well they price the table's kernels."""
    spec = ProfileFits.of_record(configfile.load(path))
    table = spec.kernel_benchmarks
    if not table:
        return []

    names = spec.kernel_fit or kernel_table.DEFAULT_FIT
    kf = kernel_table.fit(profile, kernel_table.load(table), names, spec.kernel_dtype)
    costs = ", ".join(f"{n} {hardware.value(kf.profile, n):.3g}" for n in names)
    line = (
        f"matrix kernels from {table} (fitted before any model, every model's runs priced "
        f"with them): {len(kf.errors)} kernels, median |error| "
        f"{100 * kf.median_error:.1f}%, total {kf.total_ratio:.2f} x measured; {costs}"
    )
    return [line, ""]


def run(
    paths: list[str] | None,
    say: Callable[[str], None] | None = None,
    emit: Callable[[str], None] | None = None,
) -> str:
    """The whole report, as markdown text; `emit` takes each profile's part as it is done
    and then the summary, `say` progress lines."""
    suite_checks.forget()
    out = ["# Validation: predictions against figures no profile was fitted to", ""]
    summary, t0 = [], time.perf_counter()
    emit = emit or (lambda part: None)
    checked = profiles_to_check(paths)
    emit("\n".join(out))
    for i, path in enumerate(checked):
        if say is not None:
            say(
                f"validating {i + 1}/{len(checked)}: {path}; elapsed "
                f"{units.clock(time.perf_counter() - t0)}"
            )
        lines, figures = report_profile(path, say)
        out += [*lines, ""]
        emit("\n".join([*lines, ""]))
        summary.append((Path(path).name, figures))
    head = "| profile | worst single-device (left out) | worst efficiency points | median error "
    start = len(out)
    out += ["## Summary", "", head + "here | rank correlation here |", "|---|---|---|---|---|"]
    for name, f in summary:
        cells = [
            f"{100 * f.single:.1f}%" if f.single is not None else "-",
            f"{f.points:.1f}" if f.points is not None else "-",
            f"{100 * f.median:.1f}%" if f.median is not None else "-",
            f"{f.rank:.3f}" if f.rank is not None else "-",
        ]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    emit("\n".join(out[start:]))
    return "\n".join(out)
