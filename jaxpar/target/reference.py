"""A reference run to a target: what the steps model starts from, read from a run's workdir or
from a JSON file of the same figures measured elsewhere, both through one path: a per-step
noise trace (steps.py).

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
from jaxpar.optim import batch_scaled_rate
from jaxpar.target import steps as steps_lib
from jaxpar.target.gain import gain_at
from jaxpar.target.steps import TracePoint

LR_RULES = ("noise", "linear", "none", "adascale")
# The sync modes' step factors measured on the reference's own model (plan --calibrate-sync),
# kept beside the reference: in its workdir, or beside its JSON file as FILE.sync_factors.json.
SYNC_FACTORS_FILE = "sync_factors.json"
# Steps of noise-scale figures a reference needs: the estimates are smoothed over about 20
# steps (noise_scale_decay 0.95), and a trace shorter than that is mostly its first steps.
MIN_NOISE_STEPS = 20


@dataclasses.dataclass(frozen=True)
class Reference:
    """One measured run to a target."""

    batch_size: int  # B0: its global batch
    steps_to_target: int  # S(B0)
    base_batch: int  # Bb: the batch its progress counts steps of (B0, or AdaScale's base)
    trace: tuple[TracePoint, ...]  # per step to the target: phi and the progress made
    noise_scale: float  # one B_noise for the whole run (the one-average model's)
    lr_rule: str  # how its rate would change with the batch (LR_RULES)
    target: str = ""  # what it reached, in words
    source: str = ""  # the workdir or file it was read from
    learning_rate: float | None = None  # its peak rate, at base_batch
    target_accuracy: float | None = None  # the accuracy target it reached, if one
    # (mode, setting) -> steps over allreduce's, measured on its model (SYNC_FACTORS_FILE)
    sync_factors: dict[tuple[str, int], float] = dataclasses.field(default_factory=dict)

    @property
    def progress_to_target(self) -> float:
        """The progress (steps at the base batch) the reference made to its target."""
        return sum(p.progress for p in self.trace)

    def steps(self, batch: float) -> float:
        """Predicted steps to the target at global batch `batch`: along the noise trace."""
        return steps_lib.steps_along(self.trace, batch, self.base_batch)

    def steps_one_average(self, batch: float) -> float:
        """The same with one B_noise for the whole run (`noise_scale`)."""
        return steps_lib.steps_one_average(
            self.progress_to_target, self.noise_scale, batch, self.base_batch
        )

    @property
    def min_steps(self) -> float:
        """The one-average model's S_min: the steps at an infinite batch."""
        return self.progress_to_target / (1 + self.noise_scale / self.base_batch)

    def phases(self, parts: int = 5) -> list[tuple[int, int, float]]:
        """(first step, last step, mean B_simple) over `parts` equal spans of the trace: how
        the noise scale moved on the way to the target (infinite values left out)."""
        n = len(self.trace)
        out = []
        for i in range(parts):
            span = self.trace[i * n // parts : (i + 1) * n // parts]
            finite = [p.noise_scale for p in span if math.isfinite(p.noise_scale)]
            if span:
                mean = sum(finite) / len(finite) if finite else math.inf
                out.append((span[0].step, span[-1].step, mean))
        return out

    def learning_rate_at(self, batch: float) -> float | None:
        """The rate the prediction assumes at `batch`: AdaScale's at the base batch times the
        gain at the one average (`lr_rule` adascale), else the reference's rule."""
        if self.learning_rate is None:
            return None
        if self.lr_rule == "adascale":
            return self.learning_rate * gain_at(self.noise_scale, self.base_batch, batch)
        return batch_scaled_rate(
            self.lr_rule, self.learning_rate, self.batch_size, batch, self.noise_scale
        )

    def caveat(self) -> str | None:
        """Why the prediction may not hold for this reference, in one line, or None."""
        if self.lr_rule == "none":
            return (
                "the reference kept one learning rate for every batch (lr_rule none); the "
                "steps model assumes the rate follows the noise (--config.lr_adaptation="
                "adascale, or --config.lr_noise_scale)"
            )
        return None

    def describe(self) -> str:
        """The reference in one line."""
        first, last = self.phases(2)[0][2], self.phases(2)[-1][2]
        under = (
            f" under AdaScale (base batch {self.base_batch})" if self.lr_rule == "adascale" else ""
        )
        return (
            f"batch {self.batch_size} reached it in {self.steps_to_target} steps{under}, "
            f"progress {self.progress_to_target:,.0f}; B_simple {_noise(first)} over the first "
            f"half, {_noise(last)} over the second (one average {_noise(self.noise_scale)})"
        )

    def as_record(self) -> dict[str, Any]:
        """The reference as plan.json keeps it (without the per-step trace)."""
        return {
            "batch_size": self.batch_size,
            "steps_to_target": self.steps_to_target,
            "base_batch": self.base_batch,
            "progress_to_target": self.progress_to_target,
            "noise_scale": self.noise_scale,
            "lr_rule": self.lr_rule,
            "target": self.target,
            "source": self.source,
            "learning_rate": self.learning_rate,
            "target_accuracy": self.target_accuracy,
            "trace_steps": len(self.trace),
            "sync_factors": [[m, k, f] for (m, k), f in sorted(self.sync_factors.items())],
        }


def _noise(value: float) -> str:
    return "not settled" if not math.isfinite(value) else f"{value:,.0f}"


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
    if "noise_scale" not in summary:
        raise ConfigError(
            f"--from-run {workdir}: the run measured no gradient noise scale; "
            "rerun it with data replicas or --config.grad_accum_steps=2 under "
            "sync.mode=allreduce"
        )
    steps = summary.get("steps_to_target")
    if steps is None:
        aim = summary.get("target") or "no target was set"
        raise ConfigError(
            f"--from-run {workdir}: the run never reached its target ({aim}); "
            "nothing to extrapolate from: train to a target it reaches "
            "(--config.target_accuracy)"
        )
    _check_accuracy(workdir, summary.get("target_accuracy"), target_accuracy)
    lines = metrics_lib.records(workdir, "noise", until=int(steps))
    if len(lines) < MIN_NOISE_STEPS:
        raise ConfigError(
            f"--from-run {workdir}: the noise scale was measured over {len(lines)} steps "
            f"to the target; at least {MIN_NOISE_STEPS} are needed to say anything (train "
            "longer, or to a later target)"
        )
    adapted = summary.get("lr_adaptation") == "adascale"
    points = [(r["step"], r.get("noise_scale")) for r in lines]
    progress = [(r["step"], r["gain"]) for r in lines if r.get("gain") is not None]
    batch = int(summary["global_batch_size"])
    return _checked(
        Reference(
            batch_size=batch,
            steps_to_target=int(steps),
            base_batch=int(summary["lr_base_batch_size"]) if adapted else batch,
            trace=_trace(points, progress, int(steps)),
            noise_scale=_average(summary),
            lr_rule="adascale" if adapted else summary.get("lr_rule", "none"),
            target=summary.get("target", ""),
            source=workdir,
            learning_rate=summary.get("peak_learning_rate"),
            target_accuracy=summary.get("target_accuracy"),
        ),
        workdir,
    )


def _average(summary: dict) -> float:
    """The run's B_noise up to its target (its whole average where that is missing): the
    ratio of the two estimates' means (noise_scale.NoiseScale.average)."""
    for key in ("noise_scale_to_target", "noise_scale"):
        if summary.get(key) is not None:
            return float(summary[key])
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
    return {
        (f["mode"], int(f["setting"])): float(f["factor"])
        for f in record.get("factors", [])
        if f.get("factor")
    }


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
