"""The strategy's figures of one step as the run's summary holds them (`StepReport`): memory
per device, collectives per device per step, and the pipeline's stages, under the keys
`analysis.report` gives them (None: the figure does not apply to the strategy)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class StepReport:
    """analysis.report's figures, in its order. A field left out is None, as a figure that does
    not apply is."""

    # memory per device: the busiest device's (per stage: one entry a stage)
    param_bytes: int | None = None
    param_bytes_per_device: int | None = None
    opt_state_bytes_per_device: int | None = None
    state_bytes_per_device: int | None = None
    program_temp_bytes_per_device: int | None = None
    stored_activation_bytes_per_device: int | None = None
    memory_bytes_per_device: int | None = None
    memory_per_device_bytes: list[int] | None = None
    # collectives: [where, kind, axes, count, bytes per step, every] rows and their totals
    collectives: list[list] | None = None
    collective_bytes_per_device: int | None = None
    collective_bytes_by_kind: dict[str, int] | None = None
    collective_bytes_by_axis: dict[str, int] | None = None
    data_allreduce_bytes: int | None = None
    halo_bytes_per_device: int | None = None
    ring_allreduce_wire_bytes: float | None = None
    # the pipeline's stages
    num_stages: int | None = None
    pipeline_schedule: str | None = None
    num_microbatches: int | None = None
    stage_bounds: list[int] | None = None
    analytic_bubble: float | None = None
    analytic_bubble_formula: str | None = None
    measured_bubble: float | None = None
    stage_time_predicted_s: list[float] | None = None
    stage_time_measured_s: list[float] | None = None
    bytes_between_stages_per_step: int | None = None
    stage_transfer_bytes_per_device: int | None = None
    peak_stash_bytes_per_device: list[int] | None = None
    stage_state_bytes_per_device: list[int] | None = None
    stage_program_temp_bytes: list[int] | None = None

    def as_record(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> StepReport:
        """From analysis.report's dict or a summary line (keys it lacks stay None)."""
        return cls(**{f.name: record.get(f.name) for f in dataclasses.fields(cls)})
