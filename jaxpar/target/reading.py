"""A reference run (reference.py) read from a run's workdir or from a JSON file of the same
figures measured elsewhere, both through one path: a per-step noise trace (steps.py), and the
sync modes' step factors measured beside it.

A workdir gives its summary (steps to the target, batch, rate rule, whether it ran AdaScale)
and its per-step "noise" lines (the smoothed B_simple after each step and, under AdaScale, the
progress each step made). A JSON file gives (docs/time_to_target.md):

    batch_size, steps_to_target, lr_rule          required
    noise_scale or noise_trace                    one B_noise, or [[step, B_simple], ...],
                                                  sparse as published traces are: linear in
                                                  the step between points
    progress_trace                                optional [[step, progress], ...] (AdaScale)
    lr_adaptation, lr_base_batch_size             optional: "adascale" and its base batch
    target, learning_rate, target_accuracy        optional
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
from collections.abc import Sequence
from typing import Any

from jaxpar import metrics as metrics_lib
from jaxpar.errors import ConfigError
from jaxpar.summary_record import NoiseScaleFigures
from jaxpar.target import steps as steps_lib
from jaxpar.target.reference import LR_RULES, Reference
from jaxpar.target.steps import TracePoint
from jaxpar.target.sync_factors import MeasuredFactors

# The sync modes' step factors measured on the reference's own model (plan --calibrate-sync),
# kept beside the reference: in its workdir, or beside its JSON file as FILE.sync_factors.json.
SYNC_FACTORS_FILE = "sync_factors.json"
# Steps of noise-scale figures a reference needs: the estimates are smoothed over about 20
# steps (noise_scale_decay 0.95), and a trace shorter than that is mostly its first steps.
MIN_NOISE_STEPS = 20


def load(path: str, target_accuracy: float | None = None) -> Reference:
    """A reference from a run's workdir or from a JSON file (module docstring), with the sync
    step factors measured beside it, if any."""
    if os.path.isdir(path):
        ref = from_workdir(path, target_accuracy)
    elif os.path.isfile(path):
        ref = from_json(path, target_accuracy)
    else:
        raise ConfigError(f"--from-run {path!r}: no such workdir or JSON file")
    return dataclasses.replace(ref, sync_factors=measured_sync_factors(path))


def from_workdir(workdir: str, target_accuracy: float | None = None) -> Reference:
    summary = metrics_lib.last_summary(workdir)
    if summary is None:
        raise ConfigError(
            f"--from-run {workdir}: no finished run there (metrics.jsonl has no "
            "summary); train it to its end first"
        )
    if summary.noise is None:
        raise ConfigError(
            f"--from-run {workdir}: the run measured no gradient noise scale; "
            "rerun it with data replicas or --config.grad_accum_steps=2 under "
            "sync.mode=allreduce"
        )
    steps = summary.steps_to_target
    if steps is None:
        aim = summary.target.target if summary.target is not None else "no target was set"
        raise ConfigError(
            f"--from-run {workdir}: the run never reached its target ({aim}); "
            "nothing to extrapolate from: train to a target it reaches "
            "(--config.target_accuracy)"
        )
    _check_accuracy(workdir, summary.target.target_accuracy, target_accuracy)
    lines = metrics_lib.records(workdir, "noise", until=int(steps))
    if len(lines) < MIN_NOISE_STEPS:
        raise ConfigError(
            f"--from-run {workdir}: the noise scale was measured over {len(lines)} steps "
            f"to the target; at least {MIN_NOISE_STEPS} are needed to say anything (train "
            "longer, or to a later target)"
        )
    rate = summary.rate
    adapted = rate is not None and rate.lr_adaptation == "adascale"
    points = [(r["step"], r.get("noise_scale")) for r in lines]
    progress = [(r["step"], r["gain"]) for r in lines if r.get("gain") is not None]
    batch = int(summary.global_batch_size)
    return _checked(
        Reference(
            batch_size=batch,
            steps_to_target=int(steps),
            base_batch=int(rate.lr_base_batch_size) if adapted else batch,
            trace=_trace(points, progress, int(steps)),
            noise_scale=_average(summary.noise),
            lr_rule="adascale" if adapted else (rate.lr_rule if rate is not None else "none"),
            target=summary.target.target,
            source=workdir,
            learning_rate=rate.peak_learning_rate if rate is not None else None,
            target_accuracy=summary.target.target_accuracy,
        ),
        workdir,
    )


def _average(noise: NoiseScaleFigures) -> float:
    """The run's B_noise up to its target (its whole average where that is missing): the
    ratio of the two estimates' means (noise_scale.NoiseScale.average)."""
    for value in (noise.noise_scale_to_target, noise.noise_scale):
        if value is not None:
            return float(value)
    return math.nan


def _trace(
    points: Sequence[tuple[int, Any]], progress: Sequence[tuple[int, float]], steps: int
) -> tuple[TracePoint, ...]:
    """The per-step trace to step `steps` from (step, B_simple) points and, under AdaScale,
    (step, progress made that step) points (else 1 a step); missing steps are interpolated."""
    phi = steps_lib.interpolated(points, steps)
    made = steps_lib.interpolated(progress, steps) if progress else [1.0] * steps
    return tuple(TracePoint(i + 1, phi[i], made[i]) for i in range(steps))


def from_json(path: str, target_accuracy: float | None = None) -> Reference:
    """The JSON form (module docstring)."""
    try:
        with open(path, encoding="utf-8") as f:
            data: dict[str, Any] = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--from-run {path}: not a readable JSON file ({e})") from None
    missing = [k for k in ("batch_size", "steps_to_target", "lr_rule") if k not in data]
    if "noise_scale" not in data and "noise_trace" not in data:
        missing.append("noise_scale or noise_trace")
    if missing:
        raise ConfigError(
            f"--from-run {path}: missing {', '.join(missing)} "
            "(docs/time_to_target.md lists the fields)"
        )
    _check_accuracy(path, data.get("target_accuracy"), target_accuracy)
    steps, batch = int(data["steps_to_target"]), int(data["batch_size"])
    points = data.get("noise_trace") or [[1, data["noise_scale"]]]
    cumulative = sorted((int(s), float(p)) for s, p in data.get("progress_trace", ()))
    made = [(s, (p - q) / (s - r)) for (r, q), (s, p) in itertools.pairwise(cumulative)]
    trace = _trace(points, made, steps)
    noise = data.get("noise_scale")
    if noise is None:  # the mean of the per-step trace, its infinite steps left out
        finite = [p.noise_scale for p in trace if math.isfinite(p.noise_scale)]
        noise = sum(finite) / len(finite) if finite else math.nan
    adapted = data.get("lr_adaptation") == "adascale"
    return _checked(
        Reference(
            batch_size=batch,
            steps_to_target=steps,
            base_batch=int(data.get("lr_base_batch_size", batch)) if adapted else batch,
            trace=trace,
            noise_scale=float(noise),
            lr_rule="adascale" if adapted else str(data["lr_rule"]),
            target=str(data.get("target", "")),
            source=path,
            learning_rate=data.get("learning_rate"),
            target_accuracy=data.get("target_accuracy"),
        ),
        path,
    )


def measured_sync_factors(path: str) -> dict[tuple[str, int], float]:
    """The sync step factors kept beside a reference at `path` (a workdir's
    SYNC_FACTORS_FILE, or FILE.sync_factors.json beside a JSON file), {} where there are
    none; a mode that never reached the target is left out."""
    beside = (
        os.path.join(path, SYNC_FACTORS_FILE)
        if os.path.isdir(path)
        else f"{os.path.splitext(path)[0]}.{SYNC_FACTORS_FILE}"
    )
    if not os.path.isfile(beside):
        return {}
    try:
        with open(beside, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{beside}: not a readable JSON file ({e})") from None
    try:
        return MeasuredFactors.of_record(record).reached()
    except (KeyError, TypeError) as e:
        raise ConfigError(f"{beside}: not a sync_factors.json record ({e!r})") from None


def _check_accuracy(where: str, reached: float | None, wanted: float | None) -> None:
    if wanted and reached is not None and abs(float(reached) - wanted) > 1e-9:
        raise ConfigError(
            f"--from-run {where} reached accuracy {reached:g}, not {wanted:g}; rerun it with "
            f"--config.target_accuracy={wanted:g}"
        )


def _checked(ref: Reference, where: str) -> Reference:
    if ref.lr_rule not in LR_RULES:
        raise ConfigError(
            f"--from-run {where}: lr_rule {ref.lr_rule!r}; choose from {', '.join(LR_RULES)}"
        )
    if ref.batch_size < 1 or ref.steps_to_target < 1:
        raise ConfigError(f"--from-run {where}: batch_size and steps_to_target must be >= 1")
    if not any(math.isfinite(p.noise_scale) for p in ref.trace):
        raise ConfigError(
            f"--from-run {where}: its noise scale never settled (|G|^2 not positive in any "
            "step to the target); train longer (a few hundred steps) before planning from it"
        )
    return ref
