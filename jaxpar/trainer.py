"""A run from start to summary: build, resume or start, compile, train, summarise.
`train_and_evaluate` is the API.

A run is built by `setup` (jaxpar/run_setup.py), its steps are jaxpar/loop.py's, and it is
summarised by jaxpar/run_summary.py. Everything it opens is closed by one ExitStack however it
ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Sequence

import jax
import ml_collections

from jaxpar import checkpoint as checkpoint_lib
from jaxpar import cluster, compile_cache, resume, run_length, units
from jaxpar import metrics as metrics_lib
from jaxpar import watchdog as watchdog_lib
from jaxpar import workdir as workdir_lib
from jaxpar.errors import TrainingError
from jaxpar.loop import Loop
from jaxpar.run_setup import Run, announce, evaluate, local_train_batch, setup
from jaxpar.run_spec import DEFAULTS
from jaxpar.run_summary import summarise
from jaxpar.summary_record import CheckpointEvaluation, RunResult

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
) -> RunResult:
    """Train `config` in `workdir`; write metrics.jsonl and TensorBoard files; return the
    summary and the trained state.

    Rerunning in the same workdir resumes from its newest checkpoint. A finished run is left
    as it is (its summary is returned, `finished`); `eval_only` evaluates the newest
    checkpoint (`evaluation`) and writes nothing. `profile` writes a JAX profiler trace of a few steps after warm-up to
    WORKDIR/profile. Raises ConfigError/DataError (bad input) or TrainingError (the run had to
    stop), each with a one-line message.
    """
    wall0 = time.perf_counter()
    compile_cache.enable(
        config.get("compile_cache", DEFAULTS.compile_cache)
    )  # before anything compiles
    compiled = compile_cache.counts()
    built = setup(config, devices, workdir)
    is_lead = jax.process_index() == 0
    if is_lead:
        workdir_lib.prepare(workdir)
    lock = workdir_lib.Lock(workdir) if is_lead else contextlib.nullcontext()
    spec = built.spec
    with lock, watchdog_lib.Watchdog(spec.hang_timeout_s, spec.stop_grace_s) as watch:
        result = _run(Run(built, workdir, watch, wall0, profile, compiled), eval_only)
    cluster.finish()  # several processes: every one is past its last collective
    return result


def _run(run: Run, eval_only: bool) -> RunResult:
    """Resume or start, compile, train and summarise."""
    setup, watch = run.setup, run.watch
    config, spec = setup.config, setup.spec
    announce(setup)
    with contextlib.ExitStack() as cleanup:  # one cleanup, however the run ends
        ckpt, restored = None, None
        if spec.checkpoint_every_steps or eval_only:
            every, keep = spec.checkpoint_every_steps, spec.checkpoint_max_to_keep
            ckpt = checkpoint_lib.Checkpointer(run.workdir, config, setup.model, every, keep)
            cleanup.enter_context(ckpt)
            watch.doing("restoring the newest checkpoint", compiling=True)
            restored = ckpt.restore(setup.strategy.host_target(), set_aside=not eval_only)
        if eval_only:
            return _evaluate_only(run, restored)
        length = run_length.Length(spec, 0)
        if restored is not None:
            length = run_length.Length(spec, restored[1], run_length.restored_progress(restored[0]))
            if length.done(restored[1]) or _ended_at_target(run, restored[1]):
                return resume.finished(run.workdir, restored[1], spec.rate)
        meta = ckpt.restored_meta if restored is not None else {}
        if restored is not None:  # where the run was: its data position, its schedule's setup
            setup = resume.resumed_setup(setup, restored[1], meta)
            run = dataclasses.replace(run, setup=setup)
        state, start = resume.initial_state(setup.strategy, spec, ckpt, restored)
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
            f"training from step {start + 1} until the progress reaches {spec.train_steps} (at most "
            f"{length.max_steps - start} steps)"
            if length.adaptive
            else f"training steps {start + 1}-{spec.train_steps}"
        )
        logger.info(
            f"compiled the train step in {units.seconds(setup.strategy.compile_time_s)} "
            f"({step_programs.said()}); {until} of {spec.batches.global_size} images"
        )
        outcome = Loop(run, start, writer, ckpt, length, meta).run_steps(state, first)
        if ckpt is not None:  # the last save is complete (or its failure raised) before the report
            watch.doing("waiting for the last checkpoint to be written")
            ckpt.close()
        return summarise(run, outcome, writer, step_programs)


def _ended_at_target(run: Run, step: int) -> bool:
    """Whether the run in the workdir stopped at its target at `step` (stop_at_target): then
    it is finished, as a run is after its last step."""
    if not run.setup.spec.target.stop_at_target:
        return False
    done = metrics_lib.last_summary(run.workdir)
    if done is None or done.target is None:
        return False
    return done.target.target_reached and done.steps == step


def _evaluate_only(run: Run, restored) -> RunResult:
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
    return RunResult(
        None, evaluation=CheckpointEvaluation(step, result["loss"], result["accuracy"])
    )
