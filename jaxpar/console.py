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


def summary_table(summary: dict[str, Any]) -> str:
    """A two-column table of the final summary, in a fixed, readable order: durations,
    sizes and meshes in the one format each has everywhere (jaxpar.units)."""
    rows = []
    for label, key, show in _summary_rows():
        value = _summary_value(summary, key, show)
        if value is not None:
            rows.append((label, value))
    width = max(len(label) for label, _ in rows)
    line = "-" * (width + 2 + max(len(v) for _, v in rows))
    verdict = [said] if (said := input_line(summary)) else []
    table = [line] + [f"{label:<{width}}  {value}" for label, value in rows] + [line]
    return "\n".join(table + verdict)


def _summary_rows() -> list[tuple[str, str | None, Any]]:
    """(label, summary key, how its value prints) in the table's order; key None: p10 - p90."""
    secs, each = units.seconds, lambda ts: ", ".join(units.seconds(t) for t in ts)
    return [
        ("mesh", "mesh", None),
        ("devices", "num_devices", None),
        ("partitioning", "partitioning", None),
        ("strategy", "strategy", None),
        ("steps", "steps", None),
        ("global batch", "global_batch_size", None),
        ("images/sec (median)", "images_per_sec", None),
        ("step time, median", "step_time_median_s", secs),
        ("step time, p10 - p90", None, None),
        ("model TFLOP/s", "model_tflops_per_sec", None),
        ("host batch time, median", "input_s_per_step", secs),
        ("  of which copy to devices", "input_put_s_per_step", secs),
        ("wait for data / step, mean", "input_wait_s_per_step", secs),
        ("loader capacity images/sec", "loader_images_per_sec", None),
        (f"input-bound (waits > {INPUT_BOUND_WAIT_SHARE:.0%} of step)", "input_bound", None),
        ("pipeline schedule", "pipeline_schedule", None),
        ("micro-batches", "num_microbatches", None),
        ("bubble, analytic", "analytic_bubble", None),
        ("bubble, measured stage times", "measured_bubble", None),
        ("chunk time / micro-batch, predicted", "stage_time_predicted_s", each),
        ("chunk time / micro-batch, measured", "stage_time_measured_s", each),
        (STAGE_TO_STAGE_LABEL, "bytes_between_stages_per_step", units.mib),
        ("parameters / device", "param_bytes_per_device", units.mib),
        ("optimizer state / device", "opt_state_bytes_per_device", units.mib),
        ("activations, working / device", "program_temp_bytes_per_device", units.mib),
        ("collectives / device / step", "collective_bytes_by_axis", _by_axis),
        ("  of which halo exchange", "halo_bytes_per_device", units.mib),
        ("compile time", "compile_time_s", secs),
        ("  its programs from the compile cache", "compile_cache_hits", None),
        ("XLA programs built in the run", "xla_programs", None),
        ("wall time", "wall_time_s", secs),
        ("epochs", "epochs", None),
        ("time per epoch", "seconds_per_epoch", secs),
        ("final train loss", "final_loss", None),
        ("eval loss", "eval_loss", None),
        ("eval accuracy", "eval_accuracy", None),
        ("train-split accuracy (inference)", "train_eval_accuracy", None),
        ("train - test accuracy gap", "generalization_gap", None),
        ("gradient noise scale, run average", "noise_scale", _noise),
        ("  smoothed, at the end", "noise_scale_last", _noise),
        ("  up to the target", "noise_scale_to_target", _noise),
        ("  small / whole batch", "noise_scale_b_small", None),
        ("progress (AdaScale), mean gain", "progress", None),
        ("target", "target", None),
        ("steps to target", "steps_to_target", None),
        ("  progress to target", "progress_to_target", None),
        ("examples to target", "examples_to_target", None),
        ("time to target (training)", "time_to_target_s", secs),
        ("evaluations, their time", "eval_time_s", secs),
    ]


def _noise(value: float) -> str:
    """B_simple as it prints: not yet positive early in training (|G|^2 still below its
    noise), which is said rather than shown as a negative figure."""
    if value is None or not math.isfinite(value) or value <= 0:
        return "not settled (|G|^2 estimate <= 0)"
    return f"{value:,.1f}"


def _compiled(summary: dict[str, Any], key: str) -> str:
    """The compile cache's rows: "3 of 3 (DIR)" for the train step's programs; "14 in
    2.31 s, 14 from the compile cache" for the run's."""
    where = summary.get("compile_cache_dir")
    if key == "compile_cache_hits":
        if not where:
            return "none: compile_cache off"
        hits, misses = summary["compile_cache_hits"], summary["compile_cache_misses"]
        return f"{hits} of {hits + misses}  ({where})"
    cached = f", {summary['xla_programs_cached']} from the compile cache" if where else ""
    return f"{summary['xla_programs']} in {units.seconds(summary['xla_compile_s'])}{cached}"


def _summary_value(summary: dict[str, Any], key: str | None, show) -> str | None:
    """One row's value as it prints; None where the row is left out (absent, not applicable
    to this strategy, or no halos)."""
    secs = units.seconds
    if key is None:
        if "step_time_p10_s" not in summary:
            return None
        return f"{secs(summary['step_time_p10_s'])} - {secs(summary['step_time_p90_s'])}"
    if summary.get(key) is None or (key == "halo_bytes_per_device" and not summary[key]):
        return None
    value = summary[key]
    if show is not None:
        value = show(value)
    else:
        value = _fmt(value) if isinstance(value, float) else str(value)
    if key == "analytic_bubble" and summary.get("analytic_bubble_formula"):
        value = f"{value}  {summary['analytic_bubble_formula']}"
    if key == "noise_scale_b_small":
        value = f"{summary[key]:g} / {summary['noise_scale_b_big']:g} images"
    if key == "progress":
        value = f"{summary[key]:,.1f} steps at {summary['lr_base_batch_size']}, mean gain "
        value += f"{summary['mean_gain']:.3f}"
    if key == "eval_time_s" and summary.get("evaluations"):
        value = f"{summary['evaluations']} evaluations, {value}"
    if key in ("compile_cache_hits", "xla_programs"):
        value = _compiled(summary, key)
    if key == "bytes_between_stages_per_step":
        value = f"{value}  ({STAGE_TO_STAGE_MEANING})"
    return value
