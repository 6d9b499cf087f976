"""The bench's typed records beside its rows, as the sweep writes them: the time-to-target
study's reference model and its summary (OUT/time_to_target.json's "model" and "summary").
Each is written by `as_record` and read back by `of_record`; the keys are the file's."""

from __future__ import annotations

import dataclasses
from typing import Any


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
class Prediction:
    """A row of predictions.json (python -m jaxpar.predict) as the bench reads it: the
    figures it merges into its own row as predicted_* (predicted.PREDICTED)."""

    name: str
    profile: str | None = None
    status: str | None = None
    error: str | None = None
    images_per_sec: float | None = None
    step_time_s: float | None = None
    compute_s: float | None = None
    comm_s: float | None = None
    bubble_s: float | None = None
    overhead_s: float | None = None
    schedule_bubble: float | None = None
    memory_bytes_per_device: float | None = None
    fits: bool | None = None
    speedup: float | None = None
    efficiency: float | None = None

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> Prediction:
        """The fields the bench reads of one predictions.json row (the rest left there)."""
        return cls(**{f.name: record.get(f.name) for f in dataclasses.fields(cls)})


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
