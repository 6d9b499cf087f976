"""The time-to-target study of a sweep (suite time_to_target): every row trains to one target,
and its measured steps and time to the target stand beside the ones the steps model predicts
from the suite's reference row (jaxpar/target/):

    predicted steps = S(B) along the reference's noise trace x the sync mode's step factor
    predicted time  = predicted steps x the row's own measured median step time

beside the one-average model's steps (one B_noise for the whole reference run). A goodput
schedule's row is predicted by simulating the schedule along the same trace on the step
times the fixed rows measured, batch by batch.

Pure functions over the aggregated rows (BenchRow) and the reference (read from its workdir), tested on
known input; target_table.py writes the study's tables.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

from jaxpar import stats
from jaxpar.bench import row_record
from jaxpar.bench.records import Repeat, Suite, SuiteRow, TargetModel, TargetSummary
from jaxpar.bench.row_record import BenchRow, TargetRow
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
    return Suite.of_record(spec).trains_to_target


def _error(predicted, measured):
    return predicted / measured - 1 if predicted is not None and measured else None


def _is_schedule(row: BenchRow) -> bool:
    return bool(row.target and row.target.schedule_phases)


def _measured(row: BenchRow, spec: SuiteRow, rec: Repeat | None) -> BenchRow:
    """`row` with what its run reported (the first repeat's record; None where the row
    failed) and its sync mode; every prediction None."""
    ran = rec if rec is not None and row.status == "ok" else Repeat.of_record({})
    setting = sync_setting(spec.sync_mode, spec.config)
    return dataclasses.replace(
        row,
        sync_mode=spec.sync_mode,
        sync_setting=setting,
        predicted_steps_to_target=None,
        predicted_steps_error=None,
        predicted_time_to_target_s=None,
        predicted_time_error=None,
        steps_to_target=ran.figures.steps_to_target,
        time_to_target_s=ran.figures.time_to_target_s,
        accuracy_at_target=ran.figures.accuracy_at_target,
        noise_scale_to_target=ran.figures.noise_scale_to_target,
        target=TargetRow(
            sync_factor=sync_factor(spec.sync_mode, setting),
            **{k: getattr(ran.target, k) for k in _REPORTED},
        ),
    )


# what a row's run reports beyond the results' columns (its summary)
_REPORTED = tuple(k for k in MEASURED_KEYS if k not in row_record.KEYS)


def annotate(
    table: list[BenchRow],
    spec_rows: tuple[SuiteRow, ...],
    records: dict[str, Repeat],
    reference: str = "",
    reference_of: Callable[[str], Reference | None] | None = None,
) -> tuple[list[BenchRow], TargetModel | None]:
    """`table` (aggregated rows, suite order) with KEYS from each row's record (the first
    repeat's summary, by row name) and the predictions from the reference row (`reference`,
    else the first row that reached the target and measured a noise scale);
    `reference_of(name)` reads a row's run as a Reference. Returns the table and the
    reference's description for the tables, or None without one."""
    specs = {r.name: r for r in spec_rows}
    table = [_measured(row, specs[row.name], records.get(row.name)) for row in table]
    ref_row = _reference_row(table, reference)
    model = reference_of(ref_row.name) if ref_row and reference_of else None
    if model is None:
        return table, None
    table = [_predicted(row, ref_row.name, model) for row in table]
    table = [
        _predict_schedule(row, table, model, specs[row.name]) if _is_schedule(row) else row
        for row in table
    ]
    batches = [r.global_batch_size for r in table if r.status == "ok"]
    table = [
        _with_target(row, model_curve=curve(model, batches)) if row.name == ref_row.name else row
        for row in table
    ]
    table = [_errors(row) for row in table]
    return table, TargetModel(
        reference_row=ref_row.name,
        batch=model.batch_size,
        steps=model.steps_to_target,
        base_batch=model.base_batch,
        progress=model.progress_to_target,
        noise_scale=model.noise_scale,
        min_steps=model.min_steps,
        phases=model.phases(),
    )


def _with_target(row: BenchRow, **figures) -> BenchRow:
    return dataclasses.replace(row, target=dataclasses.replace(row.target, **figures))


def _predicted(row: BenchRow, reference: str, model: Reference) -> BenchRow:
    """A fixed row's predictions from the reference's model (a goodput row's: its own)."""
    row = _with_target(row, reference_row=reference)
    factor, batch = row.target.sync_factor, row.global_batch_size
    if factor is None or not batch or _is_schedule(row):
        return row
    steps = model.steps(batch) * factor
    row = dataclasses.replace(row, predicted_steps_to_target=steps)
    row = _with_target(row, predicted_steps_one_average=model.steps_one_average(batch) * factor)
    if row.step_time_median_s:
        row = dataclasses.replace(row, predicted_time_to_target_s=steps * row.step_time_median_s)
    return row


def _errors(row: BenchRow) -> BenchRow:
    measured = row.steps_to_target
    row = dataclasses.replace(
        row,
        predicted_steps_error=_error(row.predicted_steps_to_target, measured),
        predicted_time_error=_error(row.predicted_time_to_target_s, row.time_to_target_s),
    )
    one = _error(row.target.predicted_steps_one_average, measured)
    return _with_target(row, predicted_steps_one_average_error=one)


def curve(model: Reference, batches: list[int], points: int = 40) -> list[list[float]]:
    """[batch, steps by the trace, steps by one average] over a log grid spanning `batches`
    (the study's plot draws both models through the measured rows)."""
    lo, hi = min(batches) / 1.5, max(batches) * 1.5
    grid = [lo * (hi / lo) ** (i / points) for i in range(points + 1)]
    return [[b, model.steps(b), model.steps_one_average(b)] for b in grid]


def _reference_row(table: list[BenchRow], name: str) -> BenchRow | None:
    ok = lambda r: r.status == "ok" and r.steps_to_target and r.noise_scale_to_target
    if name:
        found = next((r for r in table if r.name == name), None)
        return found if found is not None and ok(found) else None
    return next((r for r in table if ok(r)), None)


def _predict_schedule(
    row: BenchRow, table: list[BenchRow], model: Reference, spec: SuiteRow
) -> BenchRow:
    """A goodput row: its schedule simulated along the reference's trace, every candidate
    batch's step time the median of the fixed rows measured at that batch (its own mesh and
    sync mode, any rate rule), the decision interval the row's own."""
    mesh = tuple(row.mesh_shape or ())
    times: dict[int, list[float]] = {}
    for other in table:
        fixed = other is not row and not _is_schedule(other) and other.status == "ok"
        same = tuple(other.mesh_shape or ()) == mesh and other.sync_mode == "allreduce"
        if fixed and same and other.step_time_median_s:
            times.setdefault(other.global_batch_size, []).append(other.step_time_median_s)
    if len(times) < 2:
        return row
    setups = [goodput.Setup(b, mesh) for b in sorted(times)]
    step_s = {s: statistics.median(times[s.batch]) for s in setups}
    every = spec.goodput_every_steps
    run = goodput.simulate(model.trace, model.base_batch, lambda s: step_s[s], setups, every)
    row = dataclasses.replace(
        row, predicted_steps_to_target=run.steps, predicted_time_to_target_s=run.seconds
    )
    return _with_target(row, predicted_schedule=[[step, s.batch] for step, s in run.phases])


def summary(table: list[BenchRow]) -> TargetSummary:
    """Spearman's rank correlation of predicted against measured time to target over the rows
    with both, and the median and largest |error| of each prediction."""
    both = [r for r in table if r.predicted_time_to_target_s and r.time_to_target_s]
    rho = stats.spearman(
        [r.time_to_target_s for r in both], [r.predicted_time_to_target_s for r in both]
    )
    target = [r.target or TargetRow() for r in table]
    steps = _abs_errors([r.predicted_steps_error for r in table])
    one = _abs_errors([t.predicted_steps_one_average_error for t in target])
    time = _abs_errors([r.predicted_time_error for r in table])
    return TargetSummary(
        rows_compared=len(both),
        spearman_time=rho,
        median_abs_predicted_steps_error=_median(steps),
        max_abs_predicted_steps_error=steps[-1] if steps else None,
        median_abs_predicted_steps_one_average_error=_median(one),
        max_abs_predicted_steps_one_average_error=one[-1] if one else None,
        median_abs_predicted_time_error=_median(time),
        max_abs_predicted_time_error=time[-1] if time else None,
    )


def _abs_errors(errors: list[float | None]) -> list[float]:
    return sorted(abs(e) for e in errors if e is not None)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
