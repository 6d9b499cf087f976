"""One row of a sweep's results (results.json's "rows", results.csv's lines): `BenchRow`, one
field per column in the files' order (`KEYS`), None where a figure does not apply or the row
failed; a time-to-target study's further figures (`TargetRow`) follow them in results.json.
Written by `as_record` (and `csv_cells`), read back by `of_record` (and `of_csv`)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any


@dataclasses.dataclass(frozen=True)
class TargetRow:
    """A time-to-target study's figures of a row beyond the results' columns, in the order
    results.json holds them (jaxpar.bench.time_to_target): what the study adds, then what the
    row's run reported, then the goodput row's simulated schedule and the reference row's
    model curve (left out of the record where the study made none)."""

    sync_factor: float | None = None  # the sync mode's step multiplier
    reference_row: str | None = None
    predicted_steps_one_average: float | None = None
    predicted_steps_one_average_error: float | None = None
    target: float | None = None
    target_reached: bool | None = None
    examples_to_target: int | None = None
    eval_time_s: float | None = None
    evaluations: int | None = None
    noise_scale: float | None = None
    lr_rule: str | None = None
    lr_adaptation: str | None = None
    peak_learning_rate: float | None = None
    progress_to_target: float | None = None
    mean_gain: float | None = None
    schedule_phases: list | None = None  # [[step, phase text], ...] of a goodput schedule
    predicted_schedule: list | None = None  # [[step, batch], ...]: only where simulated
    model_curve: list | None = None  # [[batch, steps, steps one average], ...]: the reference

    def as_record(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for optional in ("predicted_schedule", "model_curve"):
            if out[optional] is None:
                del out[optional]
        return out

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> TargetRow:
        """The fields `record` (a row of results.json, or a run's summary) holds."""
        return cls(**{f.name: record.get(f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class BenchRow:
    """A sweep's row: its suite entry, its repeats' figures folded (mean, standard error), its
    speedup against its baseline, and what the accuracy, prediction and time-to-target
    studies add. `target` is set on the rows of a time-to-target study only."""

    name: str = ""
    group: str = ""
    scaling: str | None = None  # "strong", "weak" or "none"
    status: str | None = None  # "ok" or "failed"
    error: str | None = None
    mesh_shape: list[int] | None = None
    mesh_axes: list[str] | None = None
    num_devices: int | None = None
    strategy: str | None = None
    pipeline_schedule: str | None = None
    num_microbatches: int | None = None
    global_batch_size: int | None = None
    repeats: int | None = None
    images_per_sec: float | None = None
    images_per_sec_stderr: float | None = None
    images_per_sec_p10: float | None = None
    images_per_sec_p90: float | None = None
    speedup: float | None = None
    efficiency: float | None = None
    baseline: str | None = None
    step_time_median_s: float | None = None
    compile_time_s: float | None = None
    input_s_per_step: float | None = None
    input_wait_s_per_step: float | None = None
    input_wait_share: float | None = None
    loader_images_per_sec: float | None = None
    input_bound: bool | None = None
    num_params: int | None = None
    param_bytes: int | None = None
    param_bytes_per_device: int | None = None
    opt_state_bytes_per_device: int | None = None
    state_bytes_per_device: int | None = None
    program_temp_bytes_per_device: int | None = None
    stored_activation_bytes_per_device: int | None = None
    memory_bytes_per_device: int | None = None
    collective_bytes_per_device: int | None = None
    collective_bytes_by_kind: dict[str, int] | None = None
    collective_bytes_by_axis: dict[str, int] | None = None
    data_allreduce_bytes: int | None = None
    data_allreduce_over_params: float | None = None
    ring_allreduce_wire_bytes: float | None = None
    halo_bytes_per_device: int | None = None
    bytes_between_stages: int | None = None
    stage_transfer_bytes_per_device: int | None = None
    analytic_bubble: float | None = None
    measured_bubble: float | None = None
    model_flops_per_image: float | None = None
    model_flops_per_sec: float | None = None
    mfu: float | None = None
    final_loss: float | None = None
    eval_accuracy: float | None = None
    # the accuracy study (jaxpar.bench.accuracy): the setting a row repeats under another seed,
    # the published figure, and how the run generalised
    label: str | None = None
    reference: float | tuple[float, float] | list[float] | None = None
    seed: int | None = None
    steps: int | None = None
    epochs: float | None = None
    seconds_per_epoch: float | None = None
    eval_loss: float | None = None
    train_eval_loss: float | None = None
    train_eval_accuracy: float | None = None
    generalization_gap: float | None = None
    # a published efficiency for the row, and the row predicted on a hardware profile
    # (python -m jaxpar.bench --predict PROFILE)
    reference_efficiency: float | None = None
    predicted_profile: str | None = None
    predicted_status: str | None = None
    predicted_failure: str | None = None
    predicted_images_per_sec: float | None = None
    predicted_step_time_s: float | None = None
    predicted_compute_s: float | None = None
    predicted_comm_s: float | None = None
    predicted_bubble_s: float | None = None
    predicted_overhead_s: float | None = None
    predicted_bubble: float | None = None
    predicted_memory_bytes_per_device: float | None = None
    predicted_fits: bool | None = None
    predicted_speedup: float | None = None
    predicted_efficiency: float | None = None
    # predicted against measured: predicted / measured - 1 (images/sec; memory per device)
    predicted_error: float | None = None
    predicted_memory_error: float | None = None
    # time to a target (suite time_to_target: jaxpar.bench.time_to_target), measured and
    # predicted by the steps model from the suite's reference row
    steps_to_target: int | None = None
    time_to_target_s: float | None = None
    accuracy_at_target: float | None = None
    noise_scale_to_target: float | None = None
    sync_mode: str | None = None
    sync_setting: int | None = None
    predicted_steps_to_target: float | None = None
    predicted_steps_error: float | None = None
    predicted_steps_late: float | None = None
    predicted_time_to_target_s: float | None = None
    predicted_time_error: float | None = None
    # not a column: the time-to-target study's further figures, after the columns in JSON
    target: TargetRow | None = None

    def as_record(self, keys: tuple[str, ...] | None = None) -> dict[str, Any]:
        """Every column (KEYS, in order), then the study's further figures where there are
        some; or, given `keys`, those alone in that order (a study's own tables)."""
        if keys is None:
            out = {k: getattr(self, k) for k in KEYS}
            return out | (self.target.as_record() if self.target is not None else {})
        target = self.target or TargetRow()
        return {k: getattr(self if k in _COLUMNS else target, k) for k in keys}

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> BenchRow:
        """A row of results.json (a column it lacks is None)."""
        studied = any(f.name in record for f in dataclasses.fields(TargetRow))
        return cls(
            **{k: record.get(k) for k in KEYS},
            target=TargetRow.of_record(record) if studied else None,
        )

    def csv_cells(self) -> dict[str, Any]:
        """The row's line of results.csv: every column, breakdowns (dicts, lists) as JSON."""
        return {
            k: json.dumps(v) if isinstance(v, (dict, list, tuple)) else v
            for k, v in self.as_record(KEYS).items()
        }

    @classmethod
    def of_csv(cls, cells: dict[str, str]) -> BenchRow:
        """A line of results.csv as csv.DictReader gives it: text columns as written (an
        empty cell None, but for the name and group), numbers, True/False and JSON cells
        parsed."""
        return cls.of_record({k: _cell(_TYPES[k], v) for k, v in cells.items() if k in _TYPES})


KEYS = tuple(f.name for f in dataclasses.fields(BenchRow) if f.name != "target")
_COLUMNS = frozenset(KEYS)
_TYPES = {f.name: str(f.type) for f in dataclasses.fields(BenchRow) if f.name in _COLUMNS}


def _cell(kind: str, text: str) -> Any:
    """A results.csv cell as the value written: `kind` is the column's annotation."""
    if kind == "str":
        return text
    if text == "":
        return None
    if kind.startswith("str"):
        return text
    if text in ("True", "False"):
        return text == "True"
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return float(text)  # nan, inf
