"""A profile loaded and fitted to its measured runs (`load_profile`, `from_config`): the
matrix kernels' costs from published per-kernel timings (kernel_table.py), the matmul efficiency
from one run (`calibrate`), any of FITTABLE from several by bounded least squares (`fit`,
which says which cost ended at a bound). Each run's program is compiled for the profile's
target (calibration_runs.calibration_ops): a GPU profile's fit reads XLA:GPU's own programs."""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from jaxpar import configfile
from jaxpar.errors import ConfigError
from jaxpar.predict.kernels import kernel_table
from jaxpar.predict.profiles import calibration_runs, hardware, solve
from jaxpar.predict.profiles.hardware import Profile
from jaxpar.predict.profiles.records import CalibrationRun, ProfileFits
from jaxpar.predict.programs import gputarget
from jaxpar.predict.step import pricing

log = logging.getLogger(__name__)


def load_profile(path: str | Path) -> Profile:
    """Load a profile file (`get_config()` -> ConfigDict), fitted where it says how."""
    path = Path(path)
    if not path.is_file():
        shipped = Path(configfile.ROOT, "configs", "hardware").glob("*.py")
        known = sorted(p.name for p in shipped if p.stem[0] != "_")
        raise ConfigError(f"no hardware profile {str(path)!r}; choose one of {', '.join(known)}")
    return from_config(configfile.load(str(path)))


def from_config(c: Any) -> Profile:
    """A Profile from a profile ConfigDict (or dict), its costs fitted where it says how: the
    matrix kernels to `kernel_benchmarks`, the efficiency to one `calibration` run, the `fit`
    costs to `calibration_runs`, and each model of `calibrations` its own efficiency."""
    spec = ProfileFits.of_record(c)
    profile = hardware.from_config(c)
    if spec.kernel_benchmarks:  # the matrix kernels' costs from the GPU's own per-kernel timings
        names = spec.kernel_fit or kernel_table.DEFAULT_FIT
        rows = kernel_table.load(spec.kernel_benchmarks)
        profile = kernel_table.fit(profile, rows, names, spec.kernel_dtype).profile
        if spec.price_measured:  # and its layers' kernels at their measured times
            measured = kernel_table.measured(rows)
            profile = hardware.replace(
                profile, measured_kernels=measured, measured_dtype=spec.kernel_dtype
            )
    if profile.calibration:
        profile = calibrate(profile, profile.calibration)
    if spec.calibration_runs:
        result = fit(profile, list(spec.calibration_runs), spec.fit)
        profile = result.profile
        for name in result.at_bound:
            value = hardware.value(profile, name)
            log.warning("profile %s: %s fitted at its bound (%g)", profile.name, name, value)
    runs = {str(r.model): r for r in spec.calibrations}
    own = {model: calibrate(profile, run).compute.compute_efficiency for model, run in runs.items()}
    profile = hardware.replace(profile, model_runs=runs, model_efficiency=own)
    if profile.compute.compute_efficiency <= 0:
        raise ConfigError(f"profile {profile.name}: set compute_efficiency or a calibration run")
    return profile


def calibrate(profile: Profile, run: CalibrationRun) -> Profile:
    """Set compute efficiency from one measured single-device run: images/sec of a named model
    at a batch size. The step's op classes are the compiled single-device step's own (as the
    predictor counts every program); the profile's other costs (memory bandwidth, per-kernel
    times, fixed overheads) are taken as given and the matmul efficiency is what is left, so
    a prediction of the calibration run itself gives back the measured images/sec."""
    step = _measured_step(profile, run)
    ops = calibration_runs.calibration_ops(run, gputarget.of(profile))
    dtype = run.dtype
    rest = step - pricing.device_time(
        profile, dataclasses.replace(ops, matmul_flops=0.0, conv3x3_flops=0.0), dtype
    )
    if rest <= 0 or pricing.host_time(profile, ops) >= step:
        raise ConfigError(
            f"profile {profile.name}: the calibration run ({run.model}, batch "
            f"{run.batch_size}) takes {step * 1e3:.2f} ms, no more than the profile's fixed "
            "and per-kernel costs; calibrate on a larger batch"
        )
    peak = pricing.peak(profile, dtype)
    ratio = (
        profile.compute.conv3x3_efficiency / profile.compute.compute_efficiency
        if profile.compute.conv3x3_efficiency and profile.compute.compute_efficiency
        else 1.0
    )
    eff = (ops.matmul_flops + ops.conv3x3_flops / ratio) / rest / peak
    if (
        profile.device.compiler == "gpu" and profile.memory.memory_bandwidth
    ):  # on a roofline: solved
        return _solve_efficiency(profile, ops, dtype, step, eff, ratio)
    return hardware.replace(
        profile,
        compute_efficiency=eff,
        conv3x3_efficiency=eff * ratio if profile.compute.conv3x3_efficiency else 0.0,
    )


def _solve_efficiency(
    profile: Profile, ops, dtype: str, step: float, eff: float, ratio: float
) -> Profile:
    """The matmul efficiency (3x3 convolutions at `ratio` times it) whose program time is
    `step`, by bisection in log space: on a roofline a kernel bound by its bytes does not
    speed up with a higher rate, so the time is not inversely proportional to it."""

    def at(e: float) -> Profile:
        return hardware.replace(
            profile,
            compute_efficiency=e,
            conv3x3_efficiency=e * ratio if profile.compute.conv3x3_efficiency else 0.0,
        )

    try:
        found = solve.root(
            "compute_efficiency",
            lambda e: pricing.program_time(at(e), ops, dtype),
            step,
            math.log(eff) - 3.0,
            math.log(eff) + 12.0,
        )
    except ValueError:
        raise ConfigError(
            f"profile {profile.name}: the calibration run's memory-bound work "
            f"alone takes longer than its measured {step * 1e3:.2f} ms"
        ) from None
    return at(found.values["compute_efficiency"])


def _measured_step(profile: Profile, run: CalibrationRun) -> float:
    """The measured step's time less the profile's fixed step and program costs."""
    return run.step_s - profile.host.step_overhead_s - profile.host.program_overhead_s


# Profile costs `fit` may solve for, each positive (fitted in log space).
FITTABLE = (
    "compute_efficiency",
    "conv3x3_efficiency",
    "memory_bandwidth",
    "kernel_s",
    "launch_s",
    "step_overhead_s",
    "narrow_width",
    "thin_efficiency",
    "matmul_kernel_s",
)


@dataclasses.dataclass(frozen=True)
class FittedRun:
    """A run beside its images/sec at the fitted costs."""

    run: CalibrationRun
    fitted_images_per_sec: float
    error: float  # measured step time over the fitted one, less 1


@dataclasses.dataclass(frozen=True)
class Fit:
    profile: Profile
    rows: list[FittedRun]  # each run with its fitted images/sec and the error
    # the fitted costs that ended at their bound (a fraction of peak at 1): the fit wanted more
    # than the model allows, so the rows' errors say less than they seem to
    at_bound: tuple[str, ...] = ()


def fit(profile: Profile, runs: list[CalibrationRun], names: tuple[str, ...]) -> Fit:
    """Least-squares fit of the profile costs `names` (see FITTABLE) to measured single-device
    runs (relative error of each run's step time); the other costs stay as the profile gives
    them, except that a fit of compute_efficiency without conv3x3_efficiency prices every
    matmul class at the one compute_efficiency (a fit of neither keeps the profile's classes,
    e.g. from its kernel_benchmarks: kernel_table.py). Needs at least as many runs as costs. The runs' op classes come from their compiled
    steps (calibration_runs.calibration_ops)."""

    bad = [n for n in names if n not in FITTABLE]
    if bad or not names:
        raise ConfigError(
            f"profile {profile.name}: fit must name some of {', '.join(FITTABLE)}"
            f"{f'; not {bad[0]!r}' if bad else ''}"
        )
    if len(runs) < len(names):
        raise ConfigError(
            f"profile {profile.name}: fitting {len(names)} costs needs at least "
            f"{len(names)} calibration runs, got {len(runs)}"
        )
    if "compute_efficiency" in names and "conv3x3_efficiency" not in names:
        profile = hardware.replace(profile, conv3x3_efficiency=0.0)
    ops = [calibration_runs.calibration_ops(r, gputarget.of(profile)) for r in runs]
    measured = np.array([r.step_s for r in runs])
    start = {
        "compute_efficiency": 0.5,
        "conv3x3_efficiency": 0.5,
        "memory_bandwidth": 1e11,
        "kernel_s": 1e-6,
        "launch_s": 1e-6,
        "step_overhead_s": 1e-3,
        "narrow_width": 32.0,
        "thin_efficiency": 0.05,
        "matmul_kernel_s": 1e-5,
    }

    def predicted(p: Profile) -> np.ndarray:
        return np.array(
            [
                pricing.program_time(p, o, r.dtype)
                + p.host.step_overhead_s
                + p.host.program_overhead_s
                for o, r in zip(ops, runs)
            ]
        )

    # the step is a max of device and host time: a cost on the side that does not bind has no
    # gradient, so start from a few scales of the first guess and keep the best
    # a fraction of peak is at most 1 (3x3 convolutions: 3, Winograd does fewer products)
    top = {"compute_efficiency": 1.0, "thin_efficiency": 1.0, "conv3x3_efficiency": 3.0}
    solution = solve.least_squares(
        lambda values: predicted(hardware.replace(profile, **values)) / measured - 1,
        {n: hardware.value(profile, n) or start[n] for n in names},
        {n: top[n] for n in names if n in top},
        shifts=(0.0, np.log(10.0), -np.log(10.0)),
    )
    fitted = hardware.replace(profile, **solution.values)
    at_bound = solution.at_bound
    rows = [
        FittedRun(r, r.batch_size / t, t_m / t - 1)
        for r, t, t_m in zip(runs, predicted(fitted), measured)
    ]
    return Fit(fitted, rows, at_bound)
