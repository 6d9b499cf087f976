"""The step loop: dispatch a step, time it, run the hooks (jaxpar/hooks.py: the log line and
divergence check, evaluation, checkpoints), ask whether to stop (jaxpar/preemption.py), and,
under a goodput schedule (jaxpar/batch_schedule.py), move the run to another batch or mesh.

A run is one or more phases, each a `run_setup.Setup` (a batch on a mesh) with its own
prefetcher; a move ends a phase: the state is taken to its canonical form and placed in the
next setup's layout, and the next setup's step is compiled (from the compile cache after its
first time), off the clock. The hooks, the timers and the trackers live across phases.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import time
from functools import partial

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxpar import (
    batch_schedule,
    console,
    hooks,
    noise_scale,
    optim,
    preemption,
    profiling,
    run_length,
    target,
    units,
)
from jaxpar import data as data_lib
from jaxpar import metrics as metrics_lib
from jaxpar import watchdog as watchdog_lib
from jaxpar.data.prefetch import InputStats
from jaxpar.run_setup import Run, Setup, derive, evaluate, local_train_batch
from jaxpar.run_summary import TIMING_WARMUP_STEPS, LoopFigures, Outcome
from jaxpar.summary_record import LearningRate, SchedulePhases
from jaxpar.target.goodput import Setup as Candidate

logger = logging.getLogger(__name__)


class Loop:
    """One call's steps from `start` on: the hooks and trackers, and the current setup."""

    def __init__(self, run: Run, start: int, writer, ckpt, length: run_length.Length, meta: dict):
        self.run, self.setup, self.writer, self.ckpt, self.length = (
            run,
            run.setup,
            writer,
            ckpt,
            length,
        )
        setup, watch, spec = run.setup, run.watch, run.setup.spec
        self.start, self.is_lead = start, jax.process_index() == 0
        self.timer = hooks.StepTimer(watch)
        progress = None
        if self.is_lead:
            unit = "progress" if length.adaptive else "step"
            at = length.progress if length.adaptive else start
            progress = console.Progress(spec.train_steps, at, unit)
        self.feed = InputStats()  # what each batch cost the host and the loop's wait for it
        self.noise = _noise_tracker(setup, run.workdir, start)
        self.window = hooks.LogWindow(
            writer,
            progress,
            setup.schedule,
            spec.batches.global_size,
            self.timer,
            ckpt,
            self.feed,
            self.noise,
        )
        if start and length.adaptive:  # the gains and progress before the resume
            self.window.adapted.replay(metrics_lib.records(run.workdir, "noise", until=start))
        self.goal = target.Target.of_spec(spec.target, spec.batches.global_size)
        if start and self.goal.wanted:  # a target met before the resume keeps its step
            self.goal.replay(metrics_lib.records(run.workdir, "eval", until=start))
        t_start = time.perf_counter()
        clock = lambda: time.perf_counter() - t_start - self.timer.excluded_s
        self.evaluation = hooks.Evaluation(
            lambda st: evaluate(self.setup, st, watch), writer, self.timer, self.goal, clock
        )
        self.after_step = hooks.Hooks()
        self.after_step.add_hook(self.window.log, every=spec.measure.log_every_steps)
        self.after_step.add_hook(self.evaluation, every=spec.measure.eval_every_steps)
        self.schedule = None
        if spec.goodput_schedule:
            devices = setup.mesh.devices.size
            self.schedule = batch_schedule.Schedule.of(setup.config, devices, start, meta)
        self.saver = None
        if ckpt is not None:  # asked every step: Orbax's policy picks the steps (Checkpointer.due)
            self.saver = hooks.Checkpoints(
                ckpt,
                lambda st: self.setup.strategy.canonical(st),
                optim.schedule_meta(spec.rate),
                self.window,
                self.timer,
                self._position,
            )
            self.after_step.add_hook(self.saver)
        profile = run.profile and self.is_lead
        first_timed = start + TIMING_WARMUP_STEPS
        self.tracer = profiling.StepTrace(run.workdir, first_timed, length.max_steps, profile)
        self.moves_s = 0.0  # off the clock: moving between setups, compiles included
        self._built: dict[Candidate, Setup] = {}  # setups already built (and compiled)

    def _position(self, step: int) -> dict:
        """What a checkpoint of `step` records of where the run is: the examples taken, the
        setup it runs, and the goodput schedule's record."""
        out = {"examples": self.setup.examples_before(step)}
        if self.schedule is not None:
            out["goodput"] = self.schedule.record()
        return out

    def run_steps(self, state, first) -> Outcome:
        """Every phase's steps until the run's end, a stop, or its target (stop_at_target)."""
        start = self.start
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(self.tracer.stop)
            stop = cleanup.enter_context(preemption.Preemption(self.run.watch))
            while True:
                state, info, move = self._phase(state, first, start, stop)
                if move is None:
                    break
                state, first = self._move(state, info.step, move)
                start = info.step
        return self._outcome(state, info)

    def _phase(self, state, first, start: int, stop):
        """One setup's steps: (state, the last step's info, the setup to move to or None)."""
        setup, watch, spec = self.setup, self.run.watch, self.setup.spec
        with data_lib.Prefetcher(
            partial(local_train_batch, setup),
            setup.strategy.put_batch,
            start + 1,
            self.length.max_steps,
            stats=self.feed,
        ) as batches:
            previous = None  # the metrics of the step before, for the run's length
            for i, batch in itertools.chain([(start, first)], batches):
                self.tracer.before(i, state)
                watch.doing(f"running step {i + 1}")
                state, metrics = setup.strategy.train_step(state, batch)
                watchdog_lib.injected_hang(i + 1)
                self.tracer.after(i, (state, metrics))
                self.timer.dispatched(i + 1, metrics)
                self.window.add(metrics)
                final = self.length.final(i + 1, metrics, previous)
                previous = metrics
                # Every process asks every step: they agree on the step to stop at.
                info = hooks.StepInfo(i + 1, state, final=final, stopping=stop.check(i + 1))
                self.after_step.run(info)
                if info.stopping and not info.final:
                    logger.info(stop.stopped_line(info.step, self.ckpt))
                    return state, info, None
                if self.evaluation.reached_now and spec.target.stop_at_target and not info.final:
                    _end_at_target(info, self.window, self.saver)
                    return state, info, None
                if info.final:
                    return state, info, None
                if self.schedule is not None and self.schedule.due(info.step):
                    move = self._decide(info.step)
                    if move is not None:
                        return state, info, move
        return state, info, None

    def _decide(self, step: int) -> Candidate | None:
        """The goodput schedule's choice after `step`: a setup to move to, or None to stay.
        With several processes process 0's choice is everyone's (their step times differ)."""
        smoothed = self.noise.smoothed if self.noise is not None else math.nan
        choice = self.schedule.decide(step, smoothed, self.timer.times)
        current = self.schedule.current
        if choice is None:
            self.writer.write(step, "schedule", noise_scale=None, current=current.describe())
            return None
        best = choice.best
        if jax.process_count() > 1:
            index = self.schedule.candidates.index(best)
            index = int(multihost_utils.broadcast_one_to_all(np.int32(index)))
            best = self.schedule.candidates[index]
        self.writer.write(
            step,
            "schedule",
            noise_scale=smoothed,
            current=current.describe(),
            chosen=best.describe(),
            candidates=[
                {
                    "batch": s.batch,
                    "mesh_shape": list(s.mesh_shape),
                    "accum": s.accum,
                    "step_s": choice.step_s[s],
                    "step_source": choice.sources.get(s, ""),
                    "progress_per_s": choice.rates[s],
                }
                for s in sorted(choice.rates)
            ],
        )
        if best == current:
            return None
        logger.info(f"after step {step}: {choice.line(current)}; moving there")
        return best

    def _move(self, state, step: int, to: Candidate):
        """The run after `step` on setup `to`: (state placed there, its first batch)."""
        watch, old = self.run.watch, self.setup
        with self.timer.off_clock():
            t0 = time.perf_counter()
            watch.doing(f"moving to {to.describe()}", compiling=True)
            canonical = jax.device_get(old.strategy.canonical(state))
            self._built[self.schedule.current] = old
            origin = (step, old.examples_before(step))
            if to in self._built:  # compiled when the run was there before
                new = dataclasses.replace(self._built[to], origin=origin)
            else:
                new = derive(old, batch_schedule.changes(to), origin)
            self.setup = new
            state = new.strategy.place(canonical)
            first = new.strategy.put_batch(local_train_batch(new, step))
            reused = to in self._built
            if not reused:
                new.strategy.compile(state, first)
            watch.beat(f"moving to {to.describe()}")
            self.moves_s += time.perf_counter() - t0
        self.schedule.moved(step, to, len(self.timer.times))
        self.window.batch_size = to.batch
        if self.noise is not None:
            groups = new.strategy.noise_groups()
            self.noise.b_small, self.noise.b_big = to.batch / groups, to.batch
        self.length.rebase(step, to.batch)
        how = "its step compiled before" if reused else "compiled in "
        how += "" if reused else units.seconds(new.strategy.compile_time_s)
        logger.info(
            f"moved to {to.describe()} in {units.seconds(time.perf_counter() - t0)} ({how})"
        )
        return state, first

    def _outcome(self, state, info) -> Outcome:
        spec, length = self.setup.spec, self.length
        stopped = info.stopping and not info.final
        extra = LoopFigures(
            target=self.goal.summary(info.step, self.evaluation.seconds, self.evaluation.count),
            # what a plan from this run (jaxpar/target/) needs to know of its learning rate
            rate=LearningRate(
                lr_rule=optim.batch_rule(spec.rate),
                lr_adaptation=spec.rate.adaptation,
                peak_learning_rate=optim.peak_learning_rate(spec.rate),
                lr_base_batch_size=spec.rate.base_batch,
                sync_mode=spec.sync.mode,
            ),
            noise=self.noise.summary(self.goal.reached_step) if self.noise is not None else None,
            adapted=self.window.adapted.summary(self.goal.reached_step)
            if length.adaptive
            else None,
            schedule=SchedulePhases(
                schedule_phases=[[s, c.describe()] for s, c in self.schedule.phases],
                schedule_moves_s=self.moves_s,
            )
            if self.schedule is not None
            else None,
        )
        return Outcome(
            state,
            self.timer.times,
            self.feed,
            self.window.last,
            self.evaluation.last,
            stopped,
            info.step,
            extra,
            self.setup,
        )


def _noise_tracker(setup: Setup, workdir: str, start: int) -> noise_scale.NoiseScale | None:
    """The run's noise-scale tracker (continued from metrics.jsonl on a resume), or None with
    a line saying why the step measures none."""
    groups = setup.strategy.noise_groups()
    if isinstance(groups, str):
        if setup.spec.measure.noise_scale:
            logger.info(f"gradient noise scale: not measured ({groups})")
        return None
    big = setup.spec.batches.global_size
    tracker = noise_scale.NoiseScale(big / groups, big, setup.spec.measure.noise_scale_decay)
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
