"""The run's summary record: the step loop's outcome, the strategy's figures of a step, the
epochs seen and, with eval_train_examples, the train split's accuracy; written, shown and
returned."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import jax

from jaxpar import analysis, compile_cache, console
from jaxpar import metrics as metrics_lib
from jaxpar.data.prefetch import InputStats
from jaxpar.run_setup import Run, Setup, evaluate
from jaxpar.step_report import StepReport
from jaxpar.summary_record import (
    AdaptedProgress,
    LearningRate,
    NoiseScaleFigures,
    RunResult,
    SchedulePhases,
    TargetFigures,
    TrainSplit,
)

logger = logging.getLogger(__name__)

TIMING_WARMUP_STEPS = 3  # steps after compile left out of throughput statistics


@dataclasses.dataclass(frozen=True)
class LoopFigures:
    """What the step loop measured beside the steps, for the summary."""

    target: TargetFigures | None  # None: no target
    rate: LearningRate
    noise: NoiseScaleFigures | None  # None: the step measures no noise scale
    adapted: AdaptedProgress | None  # None: the rate does not adapt
    schedule: SchedulePhases | None  # None: no goodput schedule


@dataclasses.dataclass
class Outcome:
    """What the step loop leaves for the summary."""

    state: Any
    step_times: list[float]
    feed: InputStats  # the host time of each prefetched batch and the loop's wait for it
    train: dict[str, float]  # the last train line
    evaluation: dict[str, float]  # the last evaluation
    stopped: bool  # by a stop request, before the last step
    last_step: int  # the step the run ended after (num_train_steps, or the target's)
    extra: LoopFigures
    setup: Setup  # the setup the run ended on (a goodput schedule may have moved it)


def summarise(
    run: Run,
    outcome: Outcome,
    writer: metrics_lib.MetricWriter,
    step_programs: compile_cache.Counts,
) -> RunResult:
    """The summary record (written and shown unless the run was stopped) and the state;
    `step_programs`: what compiling the train step built."""
    setup = outcome.setup
    jax.block_until_ready(outcome.state)
    report = _strategy_report(setup)
    summary = metrics_lib.summary(
        strategy=setup.strategy.name,
        mesh_shape=tuple(int(v) for v in setup.mesh.devices.shape),
        mesh_axes=tuple(setup.mesh.axis_names),
        partitioning=setup.strategy.partitioning(),
        steps=outcome.last_step,
        global_batch_size=setup.spec.batches.global_size,
        step_times=outcome.step_times,
        warmup=TIMING_WARMUP_STEPS,
        made=outcome.feed.made,
        waited=outcome.feed.waited,
        compile_time_s=setup.strategy.compile_time_s,
        wall_time_s=time.perf_counter() - run.wall0,
        train=outcome.train,
        evaluation=outcome.evaluation,
        num_params=setup.model.num_params,
        flops_per_example=setup.model.flops_per_example,
        report=report,
    )
    n = setup.dataset.spec.num_train  # how much of the train split the run saw
    measured = summary.throughput.images_per_sec if summary.throughput is not None else None
    extra = outcome.extra
    summary = dataclasses.replace(
        summary,
        train_examples=n,
        epochs=setup.examples_before(summary.steps) / n,
        seconds_per_epoch=n / measured if measured else None,  # at the measured rate
        target=extra.target,
        rate=extra.rate,
        noise=extra.noise,
        adapted=extra.adapted,
        schedule=extra.schedule,
        compile_cache=compile_cache.summary(step_programs, compile_cache.counts() - run.compiled),
    )
    if outcome.stopped:
        summary = dataclasses.replace(summary, preempted=True)
    else:
        split = _train_split(run, setup, outcome.state, summary.eval_accuracy)
        summary = dataclasses.replace(summary, train_split=split)
        writer.write(outcome.last_step, "summary", **summary.as_record())
        logger.info(console.summary_table(summary))
        logger.info(f"metrics: {run.workdir}/metrics.jsonl")
    return RunResult(summary, state=setup.strategy.canonical(outcome.state))


def _train_split(run: Run, setup: Setup, state, eval_accuracy: float) -> TrainSplit | None:
    """With eval_train_examples: the final model evaluated on that many train images (the
    train accuracy) and the train/test gap in accuracy; else None."""
    n = setup.spec.measure.eval_train_examples
    if not n:
        return None
    run.watch.doing("evaluating the train split", compiling=False)
    result = evaluate(setup, state, run.watch, setup.dataset.train_as_eval(n))
    split = TrainSplit(
        train_eval_loss=result["loss"],
        train_eval_accuracy=result["accuracy"],
        train_eval_examples=result["count"],
        generalization_gap=result["accuracy"] - eval_accuracy,
    )
    logger.info(
        f"train split ({result['count']:,} images, inference mode): loss {result['loss']:.4f}  "
        f"accuracy {result['accuracy']:.4f}  gap to test {split.generalization_gap:+.4f}"
    )
    return split


def _strategy_report(setup: Setup) -> StepReport:
    """The strategy's figures of a step (memory, collectives, pipeline) for the summary: the
    one place the trainer asks for them."""
    return StepReport.of_record(analysis.report(setup.strategy, setup.spec.batches.global_size))
