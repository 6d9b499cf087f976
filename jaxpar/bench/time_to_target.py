"""The time-to-target study of a sweep (suite time_to_target): every row trains to one target,
and its measured steps and time to the target stand beside the ones the steps model predicts
from the suite's reference row (jaxpar.plan.steps, McCandlish et al. 2018):

    predicted steps = S_min (1 + B_noise / B) x the sync mode's multiplier (SYNC_STEP_FACTORS)
    predicted time  = predicted steps x the row's own measured median step time

S_min and B_noise come from the reference row alone (its steps to the target at its batch and
its noise scale averaged up to the target, `noise_scale_to_target`). A second prediction uses
B_noise averaged over the second half of the reference's steps to the target only
(`late_noise_scale`): the ratio of means from step 1 is dominated by the first steps' large
|G|^2, where B_simple is smallest (docs/time_to_target.md).

Pure functions over the aggregated rows (plus the reference's noise lines, read from its
workdir when there), tested on known input; target_table.py writes the study's tables.
"""

from __future__ import annotations

import json
import os
from typing import Any

from jaxpar import stats

# The keys this study adds to each row of results.json / .csv (None where they do not apply).
KEYS = (
    "target",
    "target_reached",
    "steps_to_target",
    "examples_to_target",
    "time_to_target_s",
    "accuracy_at_target",
    "eval_time_s",
    "evaluations",
    "noise_scale",
    "noise_scale_to_target",
    "lr_rule",
    "peak_learning_rate",
    "sync_mode",
    "sync_setting",
    "sync_factor",
    "reference_row",
    "model_min_steps",
    "model_noise_scale",
    "model_noise_scale_late",
    "predicted_steps_to_target",
    "predicted_steps_error",
    "predicted_steps_late",
    "predicted_steps_late_error",
    "predicted_time_to_target_s",
    "predicted_time_error",
)


def is_study(spec) -> bool:
    """A suite whose rows train to a target (the suite's overrides or a row's config set one)."""
    layers = [dict(spec.get("overrides") or {})] + [r["config"] for r in spec.rows]
    return any(c.get("target_accuracy") or c.get("target_eval_loss") for c in layers)


def sync_of(config: dict) -> tuple[str, int]:
    """(mode, setting) of a row's config: local_sgd's period, async's max staleness, else 0."""
    mode = config.get("sync.mode", "allreduce")
    setting = {
        "local_sgd": config.get("sync.period", 4),
        "async": config.get("sync.max_staleness", 2),
    }.get(mode, 0)
    return mode, int(setting)


def late_noise_scale(noise_records: list[dict], until: int) -> float | None:
    """B_simple over the second half of the steps to the target (until/2 < step <= until): the
    ratio of the two unbiased estimates' means, as noise_scale.NoiseScale.average does."""
    rows = [r for r in noise_records if until / 2 < r["step"] <= until]
    if not rows:
        return None
    g2 = sum(r["grad_sq_est"] for r in rows) / len(rows)
    trace = sum(r["grad_trace_est"] for r in rows) / len(rows)
    return trace / g2 if g2 > 0 else None


def noise_records(workdir: str) -> list[dict]:
    """A run's per-step "noise" lines (metrics.jsonl), [] where there are none."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r.get("split") == "noise":
                out.append(r)
    return out


def _error(predicted, measured):
    return predicted / measured - 1 if predicted is not None and measured else None


def annotate(
    table: list[dict], spec_rows, records: dict[str, dict], reference: str = "", noise_of=None
) -> dict | None:
    """Add KEYS to each row of `table` (aggregated rows, suite order) from its record (the
    first repeat's summary, by row name) and the reference row (`reference`, else the first row
    that reached the target and measured a noise scale); `noise_of(name)` gives a row's noise
    lines (for the late B_noise). Returns the reference's model {reference_row, batch, steps,
    min_steps, noise_scale, noise_scale_late, min_steps_late}, or None without one."""
    from jaxpar.plan import steps as steps_lib

    specs = {r["name"]: r for r in spec_rows}
    for row in table:
        rec = records.get(row["name"]) or {}
        for key in KEYS[12:]:
            row[key] = None
        for key in KEYS[:12]:
            row[key] = rec.get(key) if row["status"] == "ok" else None
        row["sync_mode"], row["sync_setting"] = sync_of(specs[row["name"]]["config"])
        row["sync_factor"] = steps_lib.sync_factor(row["sync_mode"], row["sync_setting"])
    ref = next((r for r in table if r["name"] == reference), None) if reference else None
    if ref is None:
        ref = next(
            (
                r
                for r in table
                if r["status"] == "ok"
                and r.get("steps_to_target")
                and r.get("noise_scale_to_target")
            ),
            None,
        )
    if ref is None or not ref.get("steps_to_target") or not ref.get("noise_scale_to_target"):
        return None
    model = steps_lib.Reference(
        batch_size=int(ref["global_batch_size"]),
        steps_to_target=int(ref["steps_to_target"]),
        noise_scale=float(ref["noise_scale_to_target"]),
        lr_rule=ref.get("lr_rule") or "none",
    )
    late, late_noise = None, None
    if noise_of is not None:
        late_noise = late_noise_scale(noise_of(ref["name"]), model.steps_to_target)
    if late_noise and late_noise > 0:
        late = steps_lib.Reference(
            model.batch_size, model.steps_to_target, late_noise, model.lr_rule
        )
    for row in table:
        row["reference_row"] = ref["name"]
        row["model_min_steps"], row["model_noise_scale"] = model.min_steps, model.noise_scale
        row["model_noise_scale_late"] = late.noise_scale if late else None
        factor, batch = row["sync_factor"], row["global_batch_size"]
        if factor is None or not batch:
            continue
        row["predicted_steps_to_target"] = model.steps(batch) * factor
        row["predicted_steps_late"] = late.steps(batch) * factor if late else None
        measured = row.get("steps_to_target")
        row["predicted_steps_error"] = _error(row["predicted_steps_to_target"], measured)
        row["predicted_steps_late_error"] = _error(row["predicted_steps_late"], measured)
        if row.get("step_time_median_s"):
            row["predicted_time_to_target_s"] = (
                row["predicted_steps_to_target"] * row["step_time_median_s"]
            )
            row["predicted_time_error"] = _error(
                row["predicted_time_to_target_s"], row.get("time_to_target_s")
            )
    return {
        "reference_row": ref["name"],
        "batch": model.batch_size,
        "steps": model.steps_to_target,
        "min_steps": model.min_steps,
        "noise_scale": model.noise_scale,
        "noise_scale_late": late.noise_scale if late else None,
        "min_steps_late": late.min_steps if late else None,
    }


def summary(table: list[dict]) -> dict[str, Any]:
    """Spearman's rank correlation of predicted against measured time to target over the rows
    with both, and the median and largest |error| of the predicted steps."""
    both = [r for r in table if r.get("predicted_time_to_target_s") and r.get("time_to_target_s")]
    rho = stats.spearman(
        [r["time_to_target_s"] for r in both], [r["predicted_time_to_target_s"] for r in both]
    )
    out: dict[str, Any] = {"rows_compared": len(both), "spearman_time": rho}
    for key in ("predicted_steps_error", "predicted_steps_late_error", "predicted_time_error"):
        errs = sorted(abs(r[key]) for r in table if r.get(key) is not None)
        out[f"median_abs_{key}"] = _median(errs)
        out[f"max_abs_{key}"] = errs[-1] if errs else None
    return out


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
