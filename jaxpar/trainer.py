"""The training loop: build the state, step, evaluate, log. `train_and_evaluate` is the API.

A run is built by `setup` (jaxpar/run_setup.py) and summarised by jaxpar/run_summary.py.

The loop itself is `_train`: dispatch a step, time it, then run the hooks (jaxpar/hooks.py:
the log line and divergence check, evaluation, checkpoints) and ask whether to stop
(jaxpar/preemption.py). Everything it opens is closed by one ExitStack however it ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import jax
import ml_collections

from jaxpar import checkpoint as checkpoint_lib
from jaxpar import (
    cluster,
    compile_cache,
    console,
    hooks,
    noise_scale,
    optim,
    preemption,
    profiling,
    resume,
    run_length,
    target,
    units,
)
from jaxpar import data as data_lib
from jaxpar import metrics as metrics_lib
from jaxpar import watchdog as watchdog_lib
from jaxpar import workdir as workdir_lib
from jaxpar.data.prefetch import InputStats
from jaxpar.errors import TrainingError
from jaxpar.run_setup import Run, Setup, announce, evaluate, local_train_batch, setup
from jaxpar.run_summary import TIMING_WARMUP_STEPS, Outcome, summarise

# What callers use from here: the loop (a run is built by run_setup.py, summarised by
# run_summary.py).
__all__ = ["train_and_evaluate"]

logger = logging.getLogger(__name__)


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    devices: Sequence[jax.Device] | None = None,
    eval_only: bool = False,
    profile: bool = False,
) -> dict[str, Any]:
    """Train `config` in `workdir`; write metrics.jsonl and TensorBoard files; return summary.

    Rerunning in the same workdir resumes from its newest checkpoint. A finished run is left
    as it is (its summary is returned); `eval_only` evaluates the newest checkpoint and writes
    nothing. `profile` writes a JAX profiler trace of a few steps after warm-up to
    WORKDIR/profile. Raises ConfigError/DataError (bad input) or TrainingError (the run had to
    stop), each with a one-line message.
    """
    wall0 = time.perf_counter()
    compile_cache.enable(config.get("compile_cache", "auto"))  # before anything compiles
    compiled = compile_cache.counts()
    built = setup(config, devices, workdir)
    is_lead = jax.process_index() == 0
    if is_lead:
        workdir_lib.prepare(workdir)
    lock = workdir_lib.Lock(workdir) if is_lead else contextlib.nullcontext()
    with lock, watchdog_lib.Watchdog(config.hang_timeout_s, config.stop_grace_s) as watch:
        result = _run(Run(built, workdir, watch, wall0, profile, compiled), eval_only)
    cluster.finish()  # several processes: every one is past its last collective
    return result


def _run(run: Run, eval_only: bool) -> dict[str, Any]:
    """Resume or start, compile, train and summarise."""
    setup, watch = run.setup, run.watch
    config, total = setup.config, setup.config.num_train_steps
    announce(setup)
    with contextlib.ExitStack() as cleanup:  # one cleanup, however the run ends
        ckpt, restored = None, None
        if config.checkpoint_every_steps or eval_only:
            every, keep = config.checkpoint_every_steps, config.checkpoint.max_to_keep
            ckpt = checkpoint_lib.Checkpointer(run.workdir, config, setup.model, every, keep)
            cleanup.enter_context(ckpt)
            watch.doing("restoring the newest checkpoint", compiling=True)
            restored = ckpt.restore(setup.strategy.host_target(), set_aside=not eval_only)
        if eval_only:
            return _evaluate_only(run, restored)
        length = run_length.Length(config, 0)
        if restored is not None:
            length = run_length.Length(
                config, restored[1], run_length.restored_progress(restored[0])
            )
            if length.done(restored[1]) or _ended_at_target(run, restored[1]):
                return resume.finished(run.workdir, restored[1], config)
        state, start = resume.initial_state(setup.strategy, config, ckpt, restored)
        is_lead = jax.process_index() == 0
        writer = metrics_lib.MetricWriter(run.workdir, enabled=is_lead, resume_step=start)
        cleanup.enter_context(writer)
        if writer.archived:
            logger.info(
                f"{run.workdir} held metrics of an earlier run that left no checkpoint; they are "
                f"kept in {writer.archived}"
            )
        first = setup.strategy.put_batch(local_train_batch(setup, start))
        watch.doing("compiling the train step", compiling=True)
        before = compile_cache.counts()
        setup.strategy.compile(state, first)
        step_programs = compile_cache.counts() - before
        watch.beat("compiling the train step")
        until = (
            f"training from step {start + 1} until the progress reaches {total} (at most "
            f"{length.max_steps - start} steps)"
            if length.adaptive
            else f"training steps {start + 1}-{total}"
        )
        logger.info(
            f"compiled the train step in {units.seconds(setup.strategy.compile_time_s)} "
            f"({step_programs.said()}); {until} of {config.global_batch_size} images"
        )
        outcome = _train(run, state, first, start, writer, ckpt, length)
        if ckpt is not None:  # the last save is complete (or its failure raised) before the report
            watch.doing("waiting for the last checkpoint to be written")
            ckpt.close()
        return summarise(run, outcome, writer, step_programs)


def _train(run: Run, state, first, start: int, writer, ckpt, length: run_length.Length) -> Outcome:
    """Steps `start + 1`.. until the run's `length` (`first` is the batch of the first), each
    followed by the hooks; saves and ends early when a stop is requested."""
    setup, watch = run.setup, run.watch
    config, total = setup.config, setup.config.num_train_steps
    is_lead = jax.process_index() == 0
    timer = hooks.StepTimer(watch)
    progress = None
    if is_lead:
        position = length.progress if length.adaptive else start
        progress = console.Progress(total, position, "progress" if length.adaptive else "step")
    feed = InputStats()  # what each batch cost the host and the loop's wait for it
    noise = _noise_tracker(setup, run.workdir, start)
    window = hooks.LogWindow(
        writer, progress, setup.schedule, config.global_batch_size, timer, ckpt, feed, noise
    )
    if start and length.adaptive:  # the gains and progress before the resume
        window.adapted.replay(metrics_lib.records(run.workdir, "noise", until=start))
    goal = target.Target.from_config(config)
    if start and goal.wanted:  # a target met before the resume keeps its step
        goal.replay(metrics_lib.records(run.workdir, "eval", until=start))
    t_start = time.perf_counter()
    clock = lambda: time.perf_counter() - t_start - timer.excluded_s
    evaluation = hooks.Evaluation(lambda st: evaluate(setup, st, watch), writer, timer, goal, clock)
    after_step = hooks.Hooks()
    after_step.add_hook(window.log, every=config.log_every_steps)
    after_step.add_hook(evaluation, every=config.eval_every_steps)
    saver = None
    if ckpt is not None:  # asked every step: Orbax's policy picks the steps (Checkpointer.due)
        meta = optim.schedule_meta(config)
        saver = hooks.Checkpoints(ckpt, setup.strategy.canonical, meta, window, timer)
        after_step.add_hook(saver)
    profile = run.profile and is_lead
    tracer = profiling.StepTrace(run.workdir, start + TIMING_WARMUP_STEPS, total, profile)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(tracer.stop)
        stop = cleanup.enter_context(preemption.Preemption(watch))
        batches = cleanup.enter_context(
            data_lib.Prefetcher(
                partial(local_train_batch, setup),
                setup.strategy.put_batch,
                start + 1,
                length.max_steps,
                stats=feed,
            )
        )
        previous = None  # the metrics of the step before, for the run's length
        for i, batch in itertools.chain([(start, first)], batches):
            tracer.before(i, state)
            watch.doing(f"running step {i + 1}")
            state, metrics = setup.strategy.train_step(state, batch)
            watchdog_lib.injected_hang(i + 1)
            tracer.after(i, (state, metrics))
            timer.dispatched(i + 1, metrics)
            window.add(metrics)
            final = length.final(i + 1, metrics, previous)
            previous = metrics
            # Every process asks every step: they agree on the step to stop at.
            info = hooks.StepInfo(i + 1, state, final=final, stopping=stop.check(i + 1))
            after_step.run(info)
            if info.stopping and not info.final:
                logger.info(stop.stopped_line(info.step, ckpt))  # which step it saved, if any
                break
            if evaluation.reached_now and config.stop_at_target and not info.final:
                _end_at_target(info, window, saver)
                break
            if info.final:
                break
    stopped = info.stopping and not info.final
    extra = goal.summary(info.step, evaluation.seconds, evaluation.count)
    # what a plan from this run (jaxpar/plan/steps.py) needs to know of its learning rate
    extra.update(
        lr_rule=optim.batch_rule(config),
        lr_adaptation=optim.adaptation(config),
        peak_learning_rate=optim.peak_learning_rate(config),
        lr_base_batch_size=config.lr_base_batch_size,
        sync_mode=config.sync.mode,
    )
    if noise is not None:
        extra.update(noise.summary(goal.reached_step))
    if length.adaptive:
        extra.update(window.adapted.summary(goal.reached_step))
    return Outcome(
        state, timer.times, feed, window.last, evaluation.last, stopped, info.step, extra
    )


def _ended_at_target(run: Run, step: int) -> bool:
    """Whether the run in the workdir stopped at its target at `step` (stop_at_target): then
    it is finished, as a run is after its last step."""
    if not run.setup.config.stop_at_target:
        return False
    done = metrics_lib.last_summary(run.workdir) or {}
    return bool(done.get("target_reached")) and done.get("steps") == step


def _noise_tracker(setup: Setup, workdir: str, start: int) -> noise_scale.NoiseScale | None:
    """The run's noise-scale tracker (continued from metrics.jsonl on a resume), or None with
    a line saying why the step measures none."""
    groups = setup.strategy.noise_groups()
    if isinstance(groups, str):
        if setup.config.get("measure_noise_scale", True):
            logger.info(f"gradient noise scale: not measured ({groups})")
        return None
    big = setup.config.global_batch_size
    tracker = noise_scale.NoiseScale(big / groups, big, setup.config.noise_scale_decay)
    if start:
        tracker.replay(metrics_lib.records(workdir, "noise", until=start))
    logger.info(
        f"gradient noise scale: from {groups} groups of {big // groups} images against the "
        f"whole batch of {big}, every step (noise lines in metrics.jsonl)"
    )
    return tracker


def _end_at_target(info: hooks.StepInfo, window: hooks.LogWindow, saver) -> None:
    """stop_at_target: the steps not logged yet are logged and the state saved, as after a
    last step."""
    last = dataclasses.replace(info, final=True)
    if window.metrics:
        window.log(last)
    if saver is not None:
        saver(last)
    logger.info(f"stopping at step {info.step}: the target is reached (stop_at_target=True)")


def _evaluate_only(run: Run, restored) -> dict[str, Any]:
    """Evaluate the newest checkpoint; write nothing."""
    if restored is None:
        raise TrainingError(
            f"--eval_only needs a checkpoint, and {run.workdir} has none; train first"
        )
    host_state, step = restored
    run.watch.doing(f"evaluating the checkpoint of step {step}", compiling=True)
    result = evaluate(run.setup, run.setup.strategy.place(host_state), run.watch)
    logger.info(
        f"eval of the checkpoint of step {step}: loss {result['loss']:.4f}  "
        f"accuracy {result['accuracy']:.4f}"
    )
    return {"step": step, "eval_loss": result["loss"], "eval_accuracy": result["accuracy"]}
