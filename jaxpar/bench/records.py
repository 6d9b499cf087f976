"""The bench's typed records beside its rows (row_record.py): the time-to-target study's
reference model and its summary (OUT/time_to_target.json's "model" and "summary"), an
accuracy study's entry, the predictions read, the machine, a suite and its entries, a row's
repeat (OUT/rows/*.json) and what OUT is measured under (OUT/sweep.json). Each is written by
`as_record` and read back by `of_record`; the keys are the file's."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxpar.bench.row_record import BenchRow, TargetRow
from jaxpar.suites import SuiteRow


@dataclasses.dataclass(frozen=True)
class TargetModel:
    """The steps model a time-to-target study predicts from: its reference row's run."""

    reference_row: str  # the row's name
    batch: int  # its global batch
    steps: int  # its steps to the target
    base_batch: int  # the batch its progress counts steps of
    progress: float  # progress to the target, in steps at the base batch
    noise_scale: float  # one B_noise for the whole run
    min_steps: float  # the one-average model's steps at an infinite batch
    phases: list[tuple[int, int, float]]  # (first step, last step, mean B_simple) by fifths

    def as_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> TargetModel:
        return cls(**{**record, "phases": [tuple(p) for p in record["phases"]]})


@dataclasses.dataclass(frozen=True)
class TargetSummary:
    """How well the study's predictions ranked and matched the rows: Spearman's rank
    correlation of predicted against measured time over the rows with both, and the median
    and largest |error| of each prediction (None without any)."""

    rows_compared: int
    spearman_time: float | None
    median_abs_predicted_steps_error: float | None
    max_abs_predicted_steps_error: float | None
    median_abs_predicted_steps_one_average_error: float | None
    max_abs_predicted_steps_one_average_error: float | None
    median_abs_predicted_time_error: float | None
    max_abs_predicted_time_error: float | None

    def as_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> TargetSummary:
        return cls(**record)


@dataclasses.dataclass(frozen=True)
class AccuracyEntry:
    """One setting of an accuracy study (accuracy.md): the rows sharing a label, its seeds,
    folded into one line, the published figure beside it."""

    label: str
    group: str  # the recipe
    global_batch_size: int | None
    num_devices: int | None
    seeds: int  # rows run
    seeds_ok: int  # of those, rows that finished with an accuracy
    error: str | None  # the first failed seed's one-line error
    accuracy: float | None  # mean test accuracy over the seeds that finished
    accuracy_min: float | None
    accuracy_max: float | None
    train_accuracy: float | None  # mean accuracy on the train split (inference mode)
    gap: float | None  # mean train - test gap
    final_loss: float | None  # mean final train loss
    epochs: float | None
    steps: int | None
    seconds_per_epoch: float | None
    reference: float | tuple[float, float] | None  # the published figure or (low, high)


@dataclasses.dataclass(frozen=True)
class PredictionSummary:
    """Predicted against measured images/sec over the rows with both: their count, the median
    and mean |error|, the worst row and its signed error, Spearman's rho (None without
    rows)."""

    n: int
    median_abs_error: float | None = None
    mean_abs_error: float | None = None
    worst: str | None = None
    worst_error: float | None = None
    spearman: float | None = None


@dataclasses.dataclass(frozen=True)
class Machine:
    """What a row ran on, stored with its record (OUT/rows/*.json's "machine")."""

    jax: str
    backend: str
    device_kind: str
    devices_present: int
    cpu_cores: int | None
    processor: str

    def as_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> Machine:
        return cls(**record)

    def describe(self) -> str:
        """The machine in one line, above the results table."""
        return (
            f"{self.devices_present} {self.backend} devices ({self.device_kind}) on "
            f"{self.cpu_cores} CPU cores, JAX {self.jax}"
        )


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What a sweep's OUT is measured under (OUT/sweep.json): the suite and the --config
    overrides."""

    suite: str | None
    overrides: dict[str, Any] | None

    def as_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> Manifest:
        return cls(suite=record.get("suite"), overrides=record.get("overrides"))


@dataclasses.dataclass(frozen=True)
class Suite:
    """What the bench reads of a suite file (configs/bench/*.py) beside its base and
    overrides (jaxpar.suites builds each row's config from those)."""

    rows: tuple[SuiteRow, ...]
    reference_name: str  # the accuracy study's column for the published figures
    predict_profile: str  # a hardware profile every sweep of it is predicted on, or ""
    reference_row: str  # the time-to-target study's reference row, or "": the first fit
    trains_to_target: bool  # its overrides or a row set a target: a time-to-target study

    @classmethod
    def of_record(cls, record: Any) -> Suite:
        rows = tuple(SuiteRow.of_record(r) for r in record.rows)
        common = SuiteRow.of_record({"name": "", "config": record.get("overrides") or {}})
        return cls(
            rows=rows,
            reference_name=record.get("reference_name", "published"),
            predict_profile=record.get("predict_profile", ""),
            reference_row=record.get("reference_row", ""),
            trains_to_target=any(r.trains_to_target for r in (common, *rows)),
        )


@dataclasses.dataclass(frozen=True)
class Repeat:
    """One repeat of a row (OUT/rows/*.json: the row's process's summary, the sweep's
    fingerprint and log beside it), as the sweep reads it: the figures under the results'
    columns, what a time-to-target study reads, and the few figures aggregating needs."""

    figures: BenchRow  # the record's values under the results' columns (None: absent)
    target: TargetRow  # the record's time-to-target figures
    fingerprint: str | None = None  # the row's config's, when it ran
    log: str | None = None
    machine: Machine | None = None
    step_time_p10_s: float | None = None
    step_time_p90_s: float | None = None
    bytes_between_stages_per_step: int | None = None

    @property
    def ok(self) -> bool:
        return self.figures.status == "ok"

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> Repeat:
        machine = record.get("machine")
        return cls(
            figures=BenchRow.of_record(record),
            target=TargetRow.of_record(record),
            fingerprint=record.get("fingerprint"),
            log=record.get("log"),
            machine=Machine.of_record(machine) if machine else None,
            step_time_p10_s=record.get("step_time_p10_s"),
            step_time_p90_s=record.get("step_time_p90_s"),
            bytes_between_stages_per_step=record.get("bytes_between_stages_per_step"),
        )
