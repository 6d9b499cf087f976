"""The time-to-target study of a sweep (suite time_to_target): every row trains to one target,
and its measured steps and time to the target stand beside the ones the steps model predicts
from the suite's reference row (jaxpar/target/):

    predicted steps = S(B) along the reference's noise trace x the sync mode's step factor
    predicted time  = predicted steps x the row's own measured median step time

beside the one-average model's steps (one B_noise for the whole reference run). A goodput
schedule's row is predicted by simulating the schedule along the same trace on the step
times the fixed rows measured, batch by batch.

Pure functions over the aggregated rows and the reference (read from its workdir), tested on
known input; target_table.py writes the study's tables.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from jaxpar import run_spec, stats
from jaxpar.bench.records import TargetModel, TargetSummary
from jaxpar.target import goodput
from jaxpar.target.reference import Reference
from jaxpar.target.sync_factors import sync_factor, sync_setting

# What each row's run reported (its summary; None where the row failed or lacks it).
MEASURED_KEYS = (
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
    "lr_adaptation",
    "peak_learning_rate",
    "progress_to_target",
    "mean_gain",
    "schedule_phases",
)
# What the study adds to each row.
PREDICTED_KEYS = (
    "sync_mode",
    "sync_setting",
    "sync_factor",
    "reference_row",
    "predicted_steps_to_target",
    "predicted_steps_error",
    "predicted_steps_one_average",
    "predicted_steps_one_average_error",
    "predicted_time_to_target_s",
    "predicted_time_error",
)
KEYS = MEASURED_KEYS + PREDICTED_KEYS


def is_study(spec) -> bool:
    """A suite whose rows train to a target (the suite's overrides or a row's config set one)."""
    layers = [dict(spec.get("overrides") or {})] + [r["config"] for r in spec.rows]
    return any(c.get("target_accuracy") or c.get("target_eval_loss") for c in layers)


def _error(predicted, measured):
    return predicted / measured - 1 if predicted is not None and measured else None


def _is_schedule(row: dict) -> bool:
    return bool(row.get("schedule_phases"))


def annotate(
    table: list[dict],
    spec_rows,
    records: dict[str, dict],
    reference: str = "",
    reference_of: Callable[[str], Reference | None] | None = None,
) -> TargetModel | None:
    """Add KEYS to each row of `table` (aggregated rows, suite order) from its record (the
    first repeat's summary, by row name) and the reference row (`reference`, else the first
    row that reached the target and measured a noise scale); `reference_of(name)` reads a
    row's run as a Reference. Returns the reference's description for the tables, or None
    without one."""
    specs = {r["name"]: r for r in spec_rows}
    for row in table:
        rec = records.get(row["name"]) or {}
        for key in PREDICTED_KEYS:
            row[key] = None
        for key in MEASURED_KEYS:
            row[key] = rec.get(key) if row["status"] == "ok" else None
        config = specs[row["name"]]["config"]
        row["sync_mode"] = run_spec.setting(config, "sync.mode")
        row["sync_setting"] = sync_setting(row["sync_mode"], config)
        row["sync_factor"] = sync_factor(row["sync_mode"], row["sync_setting"])
    ref_row = _reference_row(table, reference)
    model = reference_of(ref_row["name"]) if ref_row and reference_of else None
    if model is None:
        return None
    for row in table:
        row["reference_row"] = ref_row["name"]
        factor, batch = row["sync_factor"], row["global_batch_size"]
        if factor is None or not batch or _is_schedule(row):
            continue
        row["predicted_steps_to_target"] = model.steps(batch) * factor
        row["predicted_steps_one_average"] = model.steps_one_average(batch) * factor
        if row.get("step_time_median_s"):
            row["predicted_time_to_target_s"] = (
                row["predicted_steps_to_target"] * row["step_time_median_s"]
            )
    for row in table:
        if _is_schedule(row):
            _predict_schedule(row, table, model, specs)
    ref_row["model_curve"] = curve(
        model, [r["global_batch_size"] for r in table if r["status"] == "ok"]
    )
    for row in table:
        measured = row.get("steps_to_target")
        row["predicted_steps_error"] = _error(row["predicted_steps_to_target"], measured)
        row["predicted_steps_one_average_error"] = _error(
            row["predicted_steps_one_average"], measured
        )
        row["predicted_time_error"] = _error(
            row["predicted_time_to_target_s"], row.get("time_to_target_s")
        )
    return TargetModel(
        reference_row=ref_row["name"],
        batch=model.batch_size,
        steps=model.steps_to_target,
        base_batch=model.base_batch,
        progress=model.progress_to_target,
        noise_scale=model.noise_scale,
        min_steps=model.min_steps,
        phases=model.phases(),
    )


def curve(model: Reference, batches: list[int], points: int = 40) -> list[list[float]]:
    """[batch, steps by the trace, steps by one average] over a log grid spanning `batches`
    (the study's plot draws both models through the measured rows)."""
    lo, hi = min(batches) / 1.5, max(batches) * 1.5
    grid = [lo * (hi / lo) ** (i / points) for i in range(points + 1)]
    return [[b, model.steps(b), model.steps_one_average(b)] for b in grid]


def _reference_row(table: list[dict], name: str) -> dict | None:
    ok = lambda r: (
        r["status"] == "ok" and r.get("steps_to_target") and r.get("noise_scale_to_target")
    )
    if name:
        found = next((r for r in table if r["name"] == name), None)
        return found if found is not None and ok(found) else None
    return next((r for r in table if ok(r)), None)


def _predict_schedule(row: dict, table: list[dict], model: Reference, specs: dict) -> None:
    """A goodput row: its schedule simulated along the reference's trace, every candidate
    batch's step time the median of the fixed rows measured at that batch (its own mesh and
    sync mode, any rate rule), the decision interval the row's own."""
    config = specs[row["name"]]["config"]
    mesh = tuple(row["mesh_shape"] or ())
    times: dict[int, list[float]] = {}
    for other in table:
        fixed = other is not row and not _is_schedule(other) and other["status"] == "ok"
        same = tuple(other.get("mesh_shape") or ()) == mesh and other["sync_mode"] == "allreduce"
        if fixed and same and other.get("step_time_median_s"):
            times.setdefault(other["global_batch_size"], []).append(other["step_time_median_s"])
    if len(times) < 2:
        return
    setups = [goodput.Setup(b, mesh) for b in sorted(times)]
    step_s = {s: statistics.median(times[s.batch]) for s in setups}
    every = int(config.get("goodput.every_steps", 50))
    run = goodput.simulate(model.trace, model.base_batch, lambda s: step_s[s], setups, every)
    row["predicted_steps_to_target"] = run.steps
    row["predicted_time_to_target_s"] = run.seconds
    row["predicted_schedule"] = [[step, s.batch] for step, s in run.phases]


def summary(table: list[dict]) -> TargetSummary:
    """Spearman's rank correlation of predicted against measured time to target over the rows
    with both, and the median and largest |error| of each prediction."""
    both = [r for r in table if r.get("predicted_time_to_target_s") and r.get("time_to_target_s")]
    rho = stats.spearman(
        [r["time_to_target_s"] for r in both], [r["predicted_time_to_target_s"] for r in both]
    )
    median, largest = {}, {}
    for key in (
        "predicted_steps_error",
        "predicted_steps_one_average_error",
        "predicted_time_error",
    ):
        errs = sorted(abs(r[key]) for r in table if r.get(key) is not None)
        median[key] = statistics.median(errs) if errs else None
        largest[key] = errs[-1] if errs else None
    return TargetSummary(
        rows_compared=len(both),
        spearman_time=rho,
        median_abs_predicted_steps_error=median["predicted_steps_error"],
        max_abs_predicted_steps_error=largest["predicted_steps_error"],
        median_abs_predicted_steps_one_average_error=median["predicted_steps_one_average_error"],
        max_abs_predicted_steps_one_average_error=largest["predicted_steps_one_average_error"],
        median_abs_predicted_time_error=median["predicted_time_error"],
        max_abs_predicted_time_error=largest["predicted_time_error"],
    )
