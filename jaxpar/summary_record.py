"""The run's summary (`RunSummary`): the {"split": "summary"} line of metrics.jsonl, the table
the console shows at a run's end, and what `trainer.train_and_evaluate` returns (`RunResult`).

Every field is named by its metrics.jsonl key. A part that a run may not have (no timed steps,
no target, no noise scale measured ...) is a group that is None when absent, and its keys are
then left out of the line; a field marked `absent_if_none` is left out the same way. `as_record`
writes the keys in the line's order; `of_record` reads a line back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxpar.step_report import StepReport

_ABSENT_IF_NONE = {"absent_if_none": True}


def absent_if_none() -> Any:
    """A field whose key is left out of the record where it is None."""
    return dataclasses.field(default=None, metadata=_ABSENT_IF_NONE)


def group(cls) -> dict[str, Any]:
    """The metadata of a field holding a group of keys: a record of type `cls`, or None (its
    keys absent); the field is `dataclasses.field(default=None, metadata=group(cls))`."""
    return {"group": cls}


def _flat(part) -> dict[str, Any]:
    """A record's keys in its fields' order: a group's spliced in where it stands, a group
    or an absent_if_none field that is None left out."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(part):
        value = getattr(part, f.name)
        if "group" in f.metadata:
            out.update(value.as_record() if value is not None else {})
        elif value is not None or "absent_if_none" not in f.metadata:
            out[f.name] = value
    return out


def _read(cls, record: dict[str, Any], **given: Any):
    """A record of type `cls` from a flat record's keys (an absent_if_none key may be
    missing; a group is there where its first key is); `given`: fields read otherwise."""
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in given:
            values[f.name] = given[f.name]
        elif "group" in f.metadata:
            part = f.metadata["group"]
            there = dataclasses.fields(part)[0].name in record
            values[f.name] = part.of_record(record) if there else None
        elif "absent_if_none" in f.metadata:
            values[f.name] = record.get(f.name)
        else:
            values[f.name] = record[f.name]
    return cls(**values)


class Keys:
    """A record written as its fields' keys (`_flat`) and read back from them (`_read`)."""

    def as_record(self) -> dict[str, Any]:
        return _flat(self)

    @classmethod
    def of_record(cls, record: dict[str, Any]):
        return _read(cls, record)


@dataclasses.dataclass(frozen=True)
class Throughput(Keys):
    """Global images/sec from the step times after warm-up (median, and the spread)."""

    images_per_sec: float
    step_time_median_s: float
    step_time_p10_s: float
    step_time_p90_s: float
    timed_steps: int


@dataclasses.dataclass(frozen=True)
class InputCost(Keys):
    """What the input pipeline cost per step (metrics.input_pipeline)."""

    input_s_per_step: float  # host time to make and put a batch, median
    input_put_s_per_step: float  # of which the copy to the devices, median
    input_wait_s_per_step: float  # the loop's wait for the next batch, mean
    input_wait_share: float  # that wait over the mean step time
    loader_images_per_sec: float  # global batch / host batch time
    input_bound: bool  # the wait share above metrics.INPUT_BOUND_WAIT_SHARE


@dataclasses.dataclass(frozen=True)
class TargetReached(Keys):
    """How long a run took to reach its target: steps, examples, training seconds (None where
    it was reached before a resume), and the evaluation that met it."""

    steps_to_target: int
    examples_to_target: int
    time_to_target_s: float | None
    accuracy_at_target: float
    eval_loss_at_target: float


@dataclasses.dataclass(frozen=True)
class TargetFigures(Keys):
    """The run's target (jaxpar/target/goal.py), what its evaluations cost, and when it was
    reached (None: never)."""

    target: str  # as it reads: "eval accuracy >= 0.9"
    target_reached: bool
    eval_time_s: float
    evaluations: int
    target_accuracy: float | None = absent_if_none()
    target_eval_loss: float | None = absent_if_none()
    reached: TargetReached | None = dataclasses.field(default=None, metadata=group(TargetReached))


@dataclasses.dataclass(frozen=True)
class LearningRate(Keys):
    """What a plan from this run (jaxpar/target/) needs to know of its learning rate."""

    lr_rule: str
    lr_adaptation: str
    peak_learning_rate: float
    lr_base_batch_size: int
    sync_mode: str


@dataclasses.dataclass(frozen=True)
class NoiseScaleFigures:
    """The gradient noise scale (jaxpar/noise_scale.py): the run's average B_simple and the
    last smoothed value (None: not defined yet), the two batch sizes, the steps measured, and
    with `to_target` the average up to the step the target was reached."""

    noise_scale: float | None
    noise_scale_last: float | None
    noise_scale_b_small: float
    noise_scale_b_big: float
    noise_scale_steps: int
    noise_scale_to_target: float | None = None
    to_target: bool = False  # whether the run reached a target: noise_scale_to_target is kept

    def as_record(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del out["to_target"]
        if not self.to_target:
            del out["noise_scale_to_target"]
        return out

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> NoiseScaleFigures:
        to_target = "noise_scale_to_target" in record
        return _read(
            cls,
            record,
            noise_scale_to_target=record.get("noise_scale_to_target"),
            to_target=to_target,
        )


@dataclasses.dataclass(frozen=True)
class AdaptedProgress(Keys):
    """An adapting rate's progress (jaxpar/adapted_rate.py): at the end, its mean gain per
    step, and at the step the target was reached (where known)."""

    progress: float
    mean_gain: float
    progress_to_target: float | None = absent_if_none()


@dataclasses.dataclass(frozen=True)
class SchedulePhases(Keys):
    """A goodput schedule's phases ([first step, setup]) and the seconds its moves took."""

    schedule_phases: list[list]
    schedule_moves_s: float


@dataclasses.dataclass(frozen=True)
class CompileCacheFigures(Keys):
    """The compile cache's figures (jaxpar/compile_cache.py): its directory (None: off), the
    train step's programs found and compiled, and every program of the run (train step,
    evaluation, the report's analyses) with the seconds they took."""

    compile_cache_dir: str | None
    compile_cache_hits: int
    compile_cache_misses: int
    xla_programs: int
    xla_programs_cached: int
    xla_compile_s: float


@dataclasses.dataclass(frozen=True)
class TrainSplit(Keys):
    """With eval_train_examples: the final model on that many train images (inference mode),
    and the train - test gap in accuracy."""

    train_eval_loss: float
    train_eval_accuracy: float
    train_eval_examples: int
    generalization_gap: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSummary(Keys):
    """The run's summary (docs/config.md, "Metrics"): where and how it ran, its throughput and
    input cost, its losses, the model's size and work, the strategy's step figures, the epochs
    seen, and what the run measured on the way (target, noise scale, adapted progress, a
    goodput schedule, the compile cache, the train split)."""

    strategy: str
    partitioning: str | None  # as it reads: "hybrid data 2 x pipeline 2 (1f1b) x tensor 2"
    num_devices: int
    mesh_shape: tuple[int, ...]
    mesh_axes: tuple[str, ...]
    mesh: str  # as it reads: "(data=2, stage=2, tensor=2)"
    steps: int
    global_batch_size: int
    throughput: Throughput | None = dataclasses.field(
        default=None, metadata=group(Throughput)
    )  # None: no step timed
    input_cost: InputCost | None = dataclasses.field(default=None, metadata=group(InputCost))
    compile_time_s: float
    wall_time_s: float
    final_loss: float  # the last train line's (nan: none logged)
    eval_loss: float  # the last evaluation's (nan: none)
    eval_accuracy: float
    num_params: int
    model_flops_per_image: float  # forward + backward
    report: StepReport | None = dataclasses.field(default=None, metadata=group(StepReport))
    model_tflops_per_sec: float | None = absent_if_none()  # with a throughput
    train_examples: int | None = absent_if_none()  # the train split's size
    epochs: float | None = absent_if_none()
    seconds_per_epoch: float | None = absent_if_none()  # at the measured rate
    target: TargetFigures | None = dataclasses.field(default=None, metadata=group(TargetFigures))
    rate: LearningRate | None = dataclasses.field(default=None, metadata=group(LearningRate))
    noise: NoiseScaleFigures | None = dataclasses.field(
        default=None, metadata=group(NoiseScaleFigures)
    )
    adapted: AdaptedProgress | None = dataclasses.field(
        default=None, metadata=group(AdaptedProgress)
    )
    schedule: SchedulePhases | None = dataclasses.field(
        default=None, metadata=group(SchedulePhases)
    )
    compile_cache: CompileCacheFigures | None = dataclasses.field(
        default=None, metadata=group(CompileCacheFigures)
    )
    train_split: TrainSplit | None = dataclasses.field(default=None, metadata=group(TrainSplit))
    preempted: bool | None = absent_if_none()  # True: stopped by a request, not written

    @property
    def steps_to_target(self) -> int | None:
        """The steps the run took to its target; None without one, or where never reached."""
        reached = self.target.reached if self.target is not None else None
        return reached.steps_to_target if reached is not None else None

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> RunSummary:
        """A metrics.jsonl summary line (or a bench row holding its keys) read back."""
        return _read(
            cls,
            record,
            mesh_shape=tuple(record["mesh_shape"]),
            mesh_axes=tuple(record["mesh_axes"]),
        )


@dataclasses.dataclass(frozen=True)
class CheckpointEvaluation:
    """--eval_only: the newest checkpoint's step and its evaluation."""

    step: int
    eval_loss: float
    eval_accuracy: float


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What `trainer.train_and_evaluate` returns: the run's summary and its trained state, a
    finished run's summary as it stands, or with --eval_only the checkpoint's evaluation."""

    summary: RunSummary | None  # None: eval_only, or a finished run with no summary line
    state: Any = None  # the trained state, canonical (None: nothing trained by this call)
    finished: bool = False  # a rerun of a finished run: nothing trained
    evaluation: CheckpointEvaluation | None = None  # eval_only
