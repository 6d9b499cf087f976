"""Calibrate a hardware profile from single-device measurements, and report how well the
calibration carries to the runs it was not fitted to.

    python -m jaxpar.predict --calibrate SOURCE [SOURCE ...] --profile BASE [--fit a,b] [--pool]

A SOURCE is a bench sweep (`python -m jaxpar.bench --out OUT`), whose measured 1-device rows
are the runs, or a config file listing published runs (configs/predict/dgx1_single_gpu.py):
sources.runs_from reads either. A profile file lists the runs it is fitted to itself
(`calibration_runs`, with `fit`). Only single-device figures are fitted, so that every
multi-device row stays a check.

`--pool` (simulated CPU devices only) measures `compute_pool`: how many times one device's
rate N simulated devices reach together when each runs its own copy of the 1-device step at
once (no collectives). It is a property of the machine's cores and of the program's size,
measured like a link's bandwidth, not fitted to any partitioning's figure. It also measures the
links (`cpulinks.measure_links`) and how a matrix kernel's rate falls with its narrowest
dimension (`micro.measure_narrow`: narrow_width, which the fit then prices with) and the
forward pass (`micro.measure_forward`: forward_speedup, from the fitted rates).
"""

from __future__ import annotations

import dataclasses
import statistics

import jax

from jaxpar import analysis
from jaxpar.errors import ConfigError
from jaxpar.predict.calibrate import timer
from jaxpar.predict.kernels import opclass
from jaxpar.predict.profiles import fitting, hardware
from jaxpar.predict.profiles.calibration_runs import calibration_ops, run_config
from jaxpar.predict.profiles.records import CalibrationRun
from jaxpar.predict.programs import gputarget
from jaxpar.predict.programs.workload import strategy_for
from jaxpar.predict.step import pricing


@dataclasses.dataclass(frozen=True)
class CrossCheck:
    """A run predicted by a fit on the other models' runs only."""

    run: CalibrationRun
    predicted_images_per_sec: float
    error: float  # predicted over measured images/sec, less 1
    fitted_on: list[str]  # the models fitted on


def cross_check(
    profile: hardware.Profile, runs: list[CalibrationRun], names: tuple[str, ...]
) -> list[CrossCheck]:
    """Each model's runs predicted by a fit on the other models' runs only (where those are
    enough to fit `names`): how a calibration carries across models."""
    models = sorted({r.model for r in runs})
    out = []
    for model in models:
        others = [r for r in runs if r.model != model]
        if len(others) < len(names):
            continue
        fitted = fitting.fit(profile, others, names).profile
        for r in (r for r in runs if r.model == model):
            step = pricing.program_time(fitted, calibration_ops(r, gputarget.of(fitted)), r.dtype)
            step += fitted.host.step_overhead_s + fitted.host.program_overhead_s
            out.append(
                CrossCheck(
                    r,
                    r.batch_size / step,
                    r.batch_size / step / r.images_per_sec - 1,
                    sorted({o.model for o in others}),
                )
            )
    return out


@dataclasses.dataclass(frozen=True)
class PoolPoint:
    """N simulated devices each running its own copy of a 1-device step at one batch."""

    n: int
    batch_size: int
    kernel_flops: float  # the mean FLOPs of the program's matrix kernels
    images_per_sec: float  # one device alone
    speedup: float  # the N devices' aggregate rate over the one device's


def measure_pool(run: CalibrationRun, counts=(2, 4, 8), seconds: float = 2.0) -> list[PoolPoint]:
    """For each per-device batch run batch / N (N in counts) and each N: one simulated device
    alone running the run's 1-device step at that batch (images/sec), and N devices each
    running its own copy of it at once: their aggregate rate over the one device's
    (`speedup`), with the mean FLOPs of the program's matrix kernels (`kernel_flops`, the size
    the pool is looked up by). Copies are dispatched round-robin without waiting (JAX's async
    dispatch), at most 2 in flight per device."""

    if len(jax.devices()) < max(counts):
        raise ConfigError(f"--pool needs {max(counts)} devices, jax has {len(jax.devices())}")
    out = []
    for batch in sorted({run.batch_size // n for n in counts}, reverse=True):
        small = dataclasses.replace(run, batch_size=batch)
        programs = []
        for d in range(max(counts)):
            strategy = strategy_for(run_config(small), 1, [jax.devices()[d]])
            (p,) = analysis.programs(strategy, batch)
            programs.append([p.compiled, *jax.block_until_ready(analysis.zeros_for(p)())])
        matmuls = opclass.classify(programs[0][0].as_text()).matmuls
        size = sum(m.flops for m in matmuls) / max(len(matmuls), 1)

        def rate(k: int, programs: list = programs) -> float:
            """Programs run per second by the first k devices, each its own copy, one call
            each a round, at most two rounds in flight; the better of two repeats."""

            def round_():
                metrics = []
                for entry in programs[:k]:
                    compiled, state, batch = entry
                    entry[1], out = compiled(state, batch)  # the state is donated: carry it
                    metrics.append(out)
                return metrics

            timed = timer.measure(round_, seconds / 2, repeats=2, min_calls=4, window=2)
            return k / timed.best

        alone = rate(1)
        for n in counts:
            together = rate(n)
            out.append(PoolPoint(n, batch, size, alone * batch, together / alone))
    return out


def report(profile: hardware.Profile, runs: list[CalibrationRun], names: tuple[str, ...]) -> str:
    """The fitted costs, each run's fit, and the cross-model check, as text."""
    result = fitting.fit(profile, runs, names)
    p = result.profile
    lines = [f"fitted {', '.join(names)} on {len(runs)} single-device run(s):"]
    for n in names:
        value = hardware.value(p, n)
        lines.append(f"  c.{n} = {value:.4g}")
    lines.append("")
    lines.append("| run | model | dtype | batch | measured img/s | fitted img/s | error |")
    lines.append("|---|---|---|---|---|---|---|")
    for f in result.rows:
        r = f.run
        lines.append(
            f"| {r.name} | {r.model} | {r.dtype} | {r.batch_size} | {r.images_per_sec:,.1f} | "
            f"{f.fitted_images_per_sec:,.1f} | {100 * f.error:+.1f}% |"
        )
    cross = cross_check(profile, runs, names)
    if cross:
        lines += [
            "",
            "each model predicted from a fit on the other models only:",
            "",
            "| model | batch | fitted on | measured img/s | predicted | error |",
            "|---|---|---|---|---|---|",
        ]
        for c in cross:
            lines.append(
                f"| {c.run.model} | {c.run.batch_size} | {'+'.join(c.fitted_on)} | "
                f"{c.run.images_per_sec:,.1f} | {c.predicted_images_per_sec:,.1f} | "
                f"{100 * c.error:+.1f}% |"
            )
        errors = sorted(abs(c.error) for c in cross)
        lines.append(
            f"cross-model median |error| {100 * statistics.median(errors):.1f}% "
            f"over {len(errors)} run(s)"
        )
    lines.append("")
    lines.append("calibration_runs for the profile file:")
    keep = (
        "model",
        "width",
        "batch_norm",
        "head",
        "dtype",
        "image_shape",
        "num_classes",
        "batch_size",
        "images_per_sec",
    )
    for r in runs:
        record = r.as_record()
        lines.append("    " + repr({k: record[k] for k in keep if k in record}) + ",")
    return "\n".join(lines)


def pool_runs(run: CalibrationRun, pool: list[PoolPoint]) -> list[CalibrationRun]:
    """The one-device measurements `measure_pool` made (one per batch), as calibration runs."""
    alone = {m.batch_size: m.images_per_sec for m in pool}
    return [
        dataclasses.replace(
            run, name=f"1 device, batch {batch} (pool)", batch_size=batch, images_per_sec=rate
        )
        for batch, rate in alone.items()
    ]


def pool_report(run: CalibrationRun, pool: list[PoolPoint]) -> str:
    lines = [
        (
            f"compute pool ({run.model} width {run.width}, N copies of the "
            f"1-device step at once, at batches {run.batch_size} / N):"
        )
    ]
    for m in pool:
        lines.append(
            f"  batch {m.batch_size} (matrix kernels of {m.kernel_flops / 1e6:.1f} "
            f"MFLOP on average; alone {m.images_per_sec:,.1f} img/s): {m.n} at "
            f"once {m.speedup:.2f}x its rate"
        )
    points = tuple((m.n, float(f"{m.kernel_flops:.3g}"), round(m.speedup, 2)) for m in pool)
    lines.append(f"  c.compute_pool = {points!r}")
    return "\n".join(lines)
