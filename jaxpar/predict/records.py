"""The predictor's record: one predicted row (`PredictedRow`), as predictions.json keeps it.

A row is written by `as_record` and read back by `of_record`; the keys and their order are
predictions.json's. Which keys a row carries depends on how far its prediction went: a row
refused before its programs were built has only its status, error, fit (and mesh, where one
was resolved); a row whose workload was built carries the workload's figures; an "ok" row its
times; `predict_rows` adds speedup and efficiency (`Scaling`), a suite its reference
(`Reference`), the command line the profile file it was predicted on.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# The workload's figures, written where the workload was built (`profile` is set).
_WORKLOAD = (
    "profile",
    "model",
    "mesh_shape",
    "mesh_axes",
    "num_devices",
    "global_batch_size",
    "schedule",
    "num_microbatches",
    "memory_bytes_per_device",
    "memory_from",
    "memory_capacity_bytes",
    "fits",
    "param_bytes",
    "overlap",
)
# The times of an "ok" row; schedule_bubble (pipelines) and input_wait_s (input-bound rows)
# only where they are set.
_TIMES = ("step_time_s", "compute_s", "comm_s", "bubble_s", "overhead_s", "grad_allreduce_s")
_AFTER_TIMES = ("input_bound", "images_per_sec", "analytic_bubble")


@dataclasses.dataclass(frozen=True)
class Scaling:
    """A row against the 1-device row of its model, as images/sec ratios (None: no base)."""

    speedup: float | None
    efficiency: float | None


@dataclasses.dataclass(frozen=True)
class Reference:
    """A suite's reference for a row: published or measured images/sec and its efficiency
    against the reference 1-device row of the same model (either may be None)."""

    images_per_sec: float | None
    efficiency: float | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PredictedRow:
    """One partitioning predicted on one profile: times (s), images/sec, memory and fit, or
    why it was refused (status "failed", `error`)."""

    profile_file: str | None = None  # the --profile file (predictions.json only)
    name: str | None = None  # the suite's row name
    profile: str | None = None  # the profile's name; None: refused before a workload
    model: str | None = None
    mesh_shape: tuple[int, ...] | None = None
    mesh_axes: tuple[str, ...] | None = None
    num_devices: int | None = None
    global_batch_size: int | None = None
    schedule: str | None = None
    num_microbatches: int | None = None
    memory_bytes_per_device: float | None = None
    memory_from: str | None = None
    memory_capacity_bytes: float | None = None
    fits: bool | None = None  # within the profile's memory (None: not known)
    param_bytes: float | None = None
    overlap: float | None = None
    status: str  # "ok" or "failed"
    error: str | None = None  # why a failed row was refused
    step_time_s: float | None = None
    compute_s: float | None = None
    comm_s: float | None = None
    bubble_s: float | None = None
    overhead_s: float | None = None
    grad_allreduce_s: float | None = None
    schedule_bubble: float | None = None  # the schedule's own bubble fraction (pipelines)
    input_wait_s: float | None = None  # the loader's wait (input-bound rows)
    input_bound: bool = False
    images_per_sec: float | None = None
    analytic_bubble: float | None = None
    collective_bytes_per_device: dict[str, int] | None = None  # by "kind axes"
    scaling: Scaling | None = None
    reference: Reference | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def speedup(self) -> float | None:
        return self.scaling.speedup if self.scaling else None

    @property
    def efficiency(self) -> float | None:
        return self.scaling.efficiency if self.scaling else None

    @property
    def reference_images_per_sec(self) -> float | None:
        return self.reference.images_per_sec if self.reference else None

    @property
    def reference_efficiency(self) -> float | None:
        return self.reference.efficiency if self.reference else None

    def as_record(self) -> dict[str, Any]:
        """The row as predictions.json keeps it (keys that do not apply left out)."""
        out: dict[str, Any] = {}
        if self.profile_file is not None:
            out["profile_file"] = self.profile_file
        if self.name is not None:
            out["name"] = self.name
        if self.profile is not None:
            out.update((k, getattr(self, k)) for k in _WORKLOAD)
            out["status"] = self.status
        elif self.mesh_shape is not None:  # refused for its device count
            out["status"] = self.status
            out.update((k, getattr(self, k)) for k in ("mesh_shape", "mesh_axes", "num_devices"))
            out["fits"] = self.fits
        else:  # refused by the trainer's checks (or failed in the planner: no fit)
            out.update(status=self.status, error=self.error)
            if self.fits is not None:
                out["fits"] = self.fits
        if self.ok:
            out.update((k, getattr(self, k)) for k in _TIMES)
            for k in ("schedule_bubble", "input_wait_s"):
                if getattr(self, k) is not None:
                    out[k] = getattr(self, k)
            out.update((k, getattr(self, k)) for k in _AFTER_TIMES)
        elif "error" not in out:
            out["error"] = self.error
        if self.collective_bytes_per_device is not None:
            out["collective_bytes_per_device"] = self.collective_bytes_per_device
        if self.scaling is not None:
            out.update(speedup=self.scaling.speedup, efficiency=self.scaling.efficiency)
        if self.reference is not None:
            out["reference_images_per_sec"] = self.reference.images_per_sec
            out["reference_efficiency"] = self.reference.efficiency
        return out

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> PredictedRow:
        """A row read back from predictions.json (or from `as_record`)."""
        derived = ("speedup", "efficiency", "reference_images_per_sec", "reference_efficiency")
        given = {k: v for k, v in record.items() if k not in derived}
        for k in ("mesh_shape", "mesh_axes"):
            if given.get(k) is not None:
                given[k] = tuple(given[k])
        if "speedup" in record:
            given["scaling"] = Scaling(record["speedup"], record["efficiency"])
        if "reference_images_per_sec" in record:
            given["reference"] = Reference(
                record["reference_images_per_sec"], record["reference_efficiency"]
            )
        return cls(**given)
