"""The planner's records, as plan.json keeps them: a candidate predicted (search.py builds
them), a candidate ranked by time to a target (to_target.py) and a candidate measured on this
machine (measure.py). Each is written by `as_record` and read back by `of_record`; the keys
are plan.json's."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxpar.plan.candidates import Candidate
from jaxpar.predict.records import PredictedRow


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """One candidate predicted on the profile: the predictor's row, the candidate, its
    collective calls per step (the default predictor's, when it succeeds), its speed-up over
    the plan's 1-device baseline (step-time ratio) and whether it fits the memory limit."""

    predicted: PredictedRow
    candidate: Candidate
    collective_calls_per_step: dict[str, int] | None = None  # by "kind axes"
    speedup: float | None = None
    fits_limit: bool = False

    @property
    def name(self) -> str:
        return self.candidate.name

    @property
    def ok(self) -> bool:
        return self.predicted.ok

    def as_record(self) -> dict[str, Any]:
        """The row as plan.json keeps it: the prediction's keys, then the planner's."""
        out = self.predicted.as_record()
        if self.collective_calls_per_step is not None:
            out["collective_calls_per_step"] = self.collective_calls_per_step
        out["candidate"] = self.candidate.as_dict()
        out["name"] = self.name
        out["speedup"] = self.speedup
        out["fits_limit"] = self.fits_limit
        return out

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> PlanRow:
        mine = ("collective_calls_per_step", "candidate", "name", "speedup", "fits_limit")
        return cls(
            predicted=PredictedRow.of_record({k: v for k, v in record.items() if k not in mine}),
            candidate=Candidate.of_record(record["candidate"]),
            collective_calls_per_step=record.get("collective_calls_per_step"),
            speedup=record["speedup"],
            fits_limit=record["fits_limit"],
        )


# Fields plan.json leaves out where they do not apply (None), as it always has.
_OPTIONAL = ("skipped_reason", "sync_steps_factor", "sync_factor_source", "schedule_phases")


@dataclasses.dataclass(frozen=True)
class TargetRow:
    """One candidate at one global batch, or a goodput schedule over several, with its
    predicted steps and time to the target."""

    name: str
    candidate: str  # the partitioning's name; a schedule's phases in words
    mesh_axes: list[str]
    mesh_shape: list[int]
    global_batch_size: int
    sync_mode: str
    step_s: float  # predicted seconds a step (a schedule's: its mean)
    images_per_sec: float
    memory_bytes_per_device: float
    fits: bool  # within the memory limit
    learning_rate: float | None  # the rate the prediction assumes at this batch
    skipped_reason: str | None = None  # why it has no prediction (no step factor)
    steps_to_target: float | None = None
    time_to_target_s: float | None = None
    sync_steps_factor: float | None = None  # the sync mode's steps over allreduce's
    sync_factor_source: str | None = None  # exact, measured on this model, or the constants
    schedule_phases: list[list] | None = None  # a schedule's [first step, batch, candidate]
    decided_by: str | None = None  # against the winner: steps, step time, memory or same

    @property
    def is_schedule(self) -> bool:
        return self.schedule_phases is not None

    def as_record(self) -> dict[str, Any]:
        """The row as plan.json keeps it (fields that do not apply left out)."""
        out = dataclasses.asdict(self)
        for key in (*_OPTIONAL, "decided_by"):
            if out[key] is None:
                del out[key]
        return out

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> TargetRow:
        return cls(**record)


@dataclasses.dataclass(frozen=True)
class Measured:
    """A candidate run through the bench on this machine, beside its prediction."""

    name: str
    predicted_images_per_sec: float
    measured_images_per_sec: float | None  # None: the row failed
    error: float | None  # predicted / measured - 1
    measured_status: str | None  # the bench row's status (None: no row)
    measured_error: str | None  # the bench row's one-line error

    def as_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> Measured:
        return cls(**record)
