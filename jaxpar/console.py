"""What the console shows of a run: the progress line of each log step (`Progress`) and the
summary table at its end (`summary_table`)."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import numpy as np

from jaxpar import units
from jaxpar.metrics import (
    INPUT_BOUND_WAIT_SHARE,
    STAGE_TO_STAGE_LABEL,
    STAGE_TO_STAGE_MEANING,
    input_line,
)
from jaxpar.step_report import StepReport
from jaxpar.summary_record import CompileCacheFigures, RunSummary, TargetFigures


class Progress:
    """One console line per log step: step (or, under an adapting rate, the progress), loss,
    learning rate, images/sec and ETA. Values given as text (a duration or a rate formatted
    by jaxpar.units) print as they are."""

    def __init__(
        self, total_steps: int, start_step: float = 0, unit: str = "step", stream=sys.stdout
    ):
        self.total, self.stream, self.unit = total_steps, stream, unit
        self.t0, self.s0 = time.perf_counter(), start_step

    def update(self, position: float, **values: float | str) -> str:
        """`position`: the steps done (or the progress made, unit "progress")."""
        elapsed = time.perf_counter() - self.t0
        done = position - self.s0
        eta = elapsed / done * max(self.total - position, 0) if done > 0 else float("nan")
        width = len(str(self.total))
        at = f"{position:>{width}}" if isinstance(position, int) else f"{position:>{width + 2}.1f}"
        parts = [f"{self.unit} {at}/{self.total}"]
        parts += [f"{k} {v if isinstance(v, str) else _fmt(v)}" for k, v in values.items()]
        parts.append(f"ETA {units.clock(eta)}")
        line = "  ".join(parts)
        print(line, file=self.stream, flush=True)
        return line


def _fmt(value: float) -> str:
    """Readable numbers: integers as they are, large values with 1 decimal, small ones with 4
    significant digits (0.0500, 2.303, 24.47 -> 24.5)."""
    if isinstance(value, (int, np.integer)):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 10:
        return f"{value:,.1f}"
    if value == 0 or abs(value) >= 1e-3:
        return f"{value:.4f}"
    return f"{value:.3g}"


def _by_axis(rows: dict[str, float]) -> str | None:
    """Collective bytes per device per step by mesh axis: "fsdp 4.79 MiB, data 1.20 MiB"."""
    shown = [(axis, n) for axis, n in sorted(rows.items(), key=lambda kv: -kv[1]) if n]
    return ", ".join(f"{axis} {units.mib(n)}" for axis, n in shown) or "none"


def summary_table(summary: RunSummary) -> str:
    """A two-column table of the final summary, in a fixed, readable order: durations,
    sizes and meshes in the one format each has everywhere (jaxpar.units). A row whose
    figure is absent, or does not apply to the strategy, is left out."""
    rows = [(label, value) for label, value in _summary_rows(summary) if value is not None]
    width = max(len(label) for label, _ in rows)
    line = "-" * (width + 2 + max(len(v) for _, v in rows))
    verdict = [said] if (said := input_line(summary)) else []
    table = [line] + [f"{label:<{width}}  {value}" for label, value in rows] + [line]
    return "\n".join(table + verdict)


def _summary_rows(s: RunSummary) -> list[tuple[str, str | None]]:
    """(label, value as it prints, None: left out) in the table's order."""
    secs, each = units.seconds, lambda ts: ", ".join(units.seconds(t) for t in ts)
    timed, cost, report = s.throughput, s.input_cost, s.report or StepReport()
    target, noise, adapted = s.target, s.noise, s.adapted
    reached = target.reached if target is not None else None
    split, cache = s.train_split, s.compile_cache
    bubble = _shown(report.analytic_bubble)
    if bubble is not None and report.analytic_bubble_formula:
        bubble = f"{bubble}  {report.analytic_bubble_formula}"
    between = _shown(report.bytes_between_stages_per_step, units.mib)
    return [
        ("mesh", _shown(s.mesh)),
        ("devices", _shown(s.num_devices)),
        ("partitioning", _shown(s.partitioning)),
        ("strategy", _shown(s.strategy)),
        ("steps", _shown(s.steps)),
        ("global batch", _shown(s.global_batch_size)),
        ("images/sec (median)", timed and _shown(timed.images_per_sec)),
        ("step time, median", timed and _shown(timed.step_time_median_s, secs)),
        (
            "step time, p10 - p90",
            timed and f"{secs(timed.step_time_p10_s)} - {secs(timed.step_time_p90_s)}",
        ),
        ("model TFLOP/s", _shown(s.model_tflops_per_sec)),
        ("host batch time, median", cost and _shown(cost.input_s_per_step, secs)),
        ("  of which copy to devices", cost and _shown(cost.input_put_s_per_step, secs)),
        ("wait for data / step, mean", cost and _shown(cost.input_wait_s_per_step, secs)),
        ("loader capacity images/sec", cost and _shown(cost.loader_images_per_sec)),
        (
            f"input-bound (waits > {INPUT_BOUND_WAIT_SHARE:.0%} of step)",
            cost and _shown(cost.input_bound),
        ),
        ("pipeline schedule", _shown(report.pipeline_schedule)),
        ("micro-batches", _shown(report.num_microbatches)),
        ("bubble, analytic", bubble),
        ("bubble, measured stage times", _shown(report.measured_bubble)),
        ("chunk time / micro-batch, predicted", _shown(report.stage_time_predicted_s, each)),
        ("chunk time / micro-batch, measured", _shown(report.stage_time_measured_s, each)),
        (STAGE_TO_STAGE_LABEL, between and f"{between}  ({STAGE_TO_STAGE_MEANING})"),
        ("parameters / device", _shown(report.param_bytes_per_device, units.mib)),
        ("optimizer state / device", _shown(report.opt_state_bytes_per_device, units.mib)),
        ("activations, working / device", _shown(report.program_temp_bytes_per_device, units.mib)),
        ("collectives / device / step", _shown(report.collective_bytes_by_axis, _by_axis)),
        ("  of which halo exchange", _shown(report.halo_bytes_per_device or None, units.mib)),
        ("compile time", _shown(s.compile_time_s, secs)),
        ("  its programs from the compile cache", cache and _cache_hits(cache)),
        ("XLA programs built in the run", cache and _programs(cache)),
        ("wall time", _shown(s.wall_time_s, secs)),
        ("epochs", _shown(s.epochs)),
        ("time per epoch", _shown(s.seconds_per_epoch, secs)),
        ("final train loss", _shown(s.final_loss)),
        ("eval loss", _shown(s.eval_loss)),
        ("eval accuracy", _shown(s.eval_accuracy)),
        ("train-split accuracy (inference)", split and _shown(split.train_eval_accuracy)),
        ("train - test accuracy gap", split and _shown(split.generalization_gap)),
        ("gradient noise scale, run average", noise and _shown(noise.noise_scale, _noise)),
        ("  smoothed, at the end", noise and _shown(noise.noise_scale_last, _noise)),
        ("  up to the target", noise and _shown(noise.noise_scale_to_target, _noise)),
        (
            "  small / whole batch",
            noise and f"{noise.noise_scale_b_small:g} / {noise.noise_scale_b_big:g} images",
        ),
        (
            "progress (AdaScale), mean gain",
            adapted
            and f"{adapted.progress:,.1f} steps at {s.rate.lr_base_batch_size}, mean gain "
            f"{adapted.mean_gain:.3f}",
        ),
        ("target", target and _shown(target.target)),
        ("steps to target", reached and _shown(reached.steps_to_target)),
        ("  progress to target", adapted and _shown(adapted.progress_to_target)),
        ("examples to target", reached and _shown(reached.examples_to_target)),
        ("time to target (training)", reached and _shown(reached.time_to_target_s, secs)),
        ("evaluations, their time", target and _evaluations(target)),
    ]


def _shown(value: Any, show=None) -> str | None:
    """A value as its row prints it: through `show`, or a float readably and anything else
    as it reads; None (the row left out) where the value is None."""
    if value is None:
        return None
    if show is not None:
        return show(value)
    return _fmt(value) if isinstance(value, float) else str(value)


def _noise(value: float) -> str:
    """B_simple as it prints: not yet positive early in training (|G|^2 still below its
    noise), which is said rather than shown as a negative figure."""
    if not math.isfinite(value) or value <= 0:
        return "not settled (|G|^2 estimate <= 0)"
    return f"{value:,.1f}"


def _cache_hits(cache: CompileCacheFigures) -> str:
    """The train step's programs: "3 of 3 (DIR)", or that the cache is off."""
    if not cache.compile_cache_dir:
        return "none: compile_cache off"
    hits, misses = cache.compile_cache_hits, cache.compile_cache_misses
    return f"{hits} of {hits + misses}  ({cache.compile_cache_dir})"


def _programs(cache: CompileCacheFigures) -> str:
    """The run's programs: "14 in 2.31 s, 14 from the compile cache"."""
    cached = (
        f", {cache.xla_programs_cached} from the compile cache" if cache.compile_cache_dir else ""
    )
    return f"{cache.xla_programs} in {units.seconds(cache.xla_compile_s)}{cached}"


def _evaluations(target: TargetFigures) -> str:
    """The evaluations' time, with their count where there were any."""
    took = units.seconds(target.eval_time_s)
    return f"{target.evaluations} evaluations, {took}" if target.evaluations else took
