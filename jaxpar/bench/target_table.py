"""The time-to-target study's tables (time_to_target.md and .csv): per row the measured steps
and time to the target beside the steps model's predictions, with the reference's model and
the rank correlation below (time_to_target.py makes the figures)."""

from __future__ import annotations

import json
import math

from jaxpar.bench import table as table_lib
from jaxpar.bench import time_to_target as ttt
from jaxpar.bench.records import TargetModel
from jaxpar.bench.row_record import BenchRow, TargetRow


def _f(v, fmt: str) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _pct(v) -> str:
    return "" if v is None else f"{100 * v:+.0f}%"


def _with_error(value, error) -> str:
    """ "132 (+2%)", or the value alone where there is nothing measured to compare with."""
    if value is None:
        return ""
    return f"{value:.0f}" + (f" ({_pct(error)})" if error is not None else "")


def _sync_cell(r: BenchRow) -> str:
    mode, setting = r.sync_mode or "allreduce", r.sync_setting
    word = {"local_sgd": "period", "async": "staleness"}.get(mode)
    return f"{mode} ({word} {setting})" if word else mode


def _steps_cell(r: BenchRow, t: TargetRow) -> str:
    """The measured steps; under AdaScale the progress they made; a goodput row's phases."""
    if not r.steps_to_target:
        return "not reached"
    text = str(r.steps_to_target)
    if t.progress_to_target:
        text += f" (progress {t.progress_to_target:.0f})"
    if t.schedule_phases:
        text += ": " + ", ".join(phase for _, phase in t.schedule_phases)
    return text


def markdown(table: list[BenchRow], model: TargetModel | None) -> str:
    """The study's table: batch x devices x partitioning -> measured and predicted steps and
    time to target, with the reference and the rank correlation below."""
    head = (
        "| row | batch | dev | mesh | sync | rate | steps to target | predicted steps (error) | "
        "predicted, one B_noise (error) | s/step [clock] | time to target s [clock] | "
        "predicted time s (error) | accuracy at target | eval s |"
    )
    lines = [head, "|" + "---|" * 14]
    for r in table:
        if r.status != "ok":
            lines.append(
                f"| {r.name} | {r.global_batch_size or ''} | | | | | failed: "
                f"{r.error} | | | | | | | |"
            )
            continue
        t = r.target or TargetRow()
        pred = (
            "no step factor measured"
            if t.sync_factor is None
            else _with_error(r.predicted_steps_to_target, r.predicted_steps_error)
        )
        one = _with_error(t.predicted_steps_one_average, t.predicted_steps_one_average_error)
        ptime = ""
        if r.predicted_time_to_target_s is not None:
            err = r.predicted_time_error
            ptime = f"{r.predicted_time_to_target_s:.1f}" + (f" ({_pct(err)})" if err else "")
        cells = [
            r.name,
            str(r.global_batch_size),
            str(r.num_devices or ""),
            table_lib.mesh_cell(r),
            _sync_cell(r),
            "AdaScale" if t.lr_adaptation == "adascale" else (t.lr_rule or ""),
            _steps_cell(r, t),
            pred,
            one,
            _f(r.step_time_median_s, ".4f"),
            _f(r.time_to_target_s, ".1f"),
            ptime,
            _f(r.accuracy_at_target, ".4f"),
            _f(t.eval_time_s, ".1f"),
        ]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    text = "\n".join(lines) + "\n"
    if model:
        phases = ", ".join(f"{m:,.0f}" if m != float("inf") else "-" for *_, m in model.phases)
        text += (
            f"\nReference: {model.reference_row} (batch {model.batch}, {model.steps} "
            f"steps, progress {model.progress:,.0f} at base batch {model.base_batch}): "
            f"B_simple over fifths of its steps {phases}; one B_noise {model.noise_scale:.1f}, "
            f"S_min {model.min_steps:.1f}.\n"
        )
    s = ttt.summary(table)
    rho = "n/a" if s.spearman_time is None else f"{s.spearman_time:.3f}"
    text += (
        f"Spearman rank correlation of predicted against measured time to target: {rho} over "
        f"{s.rows_compared} rows; |steps error| along the trace: median "
        f"{_pct(s.median_abs_predicted_steps_error).lstrip('+')}, largest "
        f"{_pct(s.max_abs_predicted_steps_error).lstrip('+')}"
    )
    if s.median_abs_predicted_steps_one_average_error is not None:
        text += (
            f" (one B_noise: median "
            f"{_pct(s.median_abs_predicted_steps_one_average_error).lstrip('+')}, largest "
            f"{_pct(s.max_abs_predicted_steps_one_average_error).lstrip('+')})"
        )
    return text + ".\n"


def to_csv(table: list[BenchRow]) -> str:
    cols = (
        "name",
        "global_batch_size",
        "num_devices",
        "mesh_shape",
        "strategy",
        "step_time_median_s",
    ) + ttt.KEYS
    lines = [",".join(cols)]
    for r in table:
        cells = []
        for v in r.as_record(cols).values():
            v = json.dumps(v) if isinstance(v, (list, tuple, dict)) else ("" if v is None else v)
            cell = str(v)
            cells.append(f'"{cell.replace(chr(34), chr(34) * 2)}"' if "," in cell else cell)
        lines.append(",".join(cells))
    return "\n".join(lines) + "\n"
