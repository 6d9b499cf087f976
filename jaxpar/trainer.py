"""The training loop: build the state, step, evaluate, log. `train_and_evaluate` is the API.

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
import numpy as np

from jaxpar import (
    analysis,
    axes,
    cluster,
    compile_cache,
    console,
    hooks,
    models,
    noise_scale,
    optim,
    parallel,
    preemption,
    profiling,
    resume,
    target,
    units,
)
from jaxpar import checkpoint as checkpoint_lib
from jaxpar import config as config_lib
from jaxpar import data as data_lib
from jaxpar import mesh as mesh_lib
from jaxpar import metrics as metrics_lib
from jaxpar import watchdog as watchdog_lib
from jaxpar import workdir as workdir_lib
from jaxpar.data.prefetch import InputStats
from jaxpar.errors import TrainingError
from jaxpar.parallel import stages
from jaxpar.parallel.pipeline import balance, microbatches
from jaxpar.parallel.state import add_sums

logger = logging.getLogger(__name__)

TIMING_WARMUP_STEPS = 3  # steps after compile left out of throughput statistics


@dataclasses.dataclass
class Setup:
    """Everything a run is built from, before any step runs."""

    config: ml_collections.ConfigDict
    mesh: Any
    dataset: data_lib.Dataset
    model: models.SequentialModel
    strategy: parallel.Strategy
    schedule: Any

    @property
    def data_size(self) -> int:
        """Data replicas: the product of the batch axes (data, node, fsdp, ...)."""
        return axes.num_replicas(dict(self.mesh.shape))


def setup(
    config: ml_collections.ConfigDict,
    devices: Sequence[jax.Device] | None = None,
    workdir: str | None = None,
) -> Setup:
    """Validate, then build mesh, data, model and strategy (nothing compiled yet).

    `config.num_devices` > 0 uses only the first N of the devices (like tf_cnn_benchmarks'
    --num_gpus): one line says so. A pipeline split by time (`pipeline.split="time"`) first
    times the model's layers on these devices (cached in `workdir`, pipeline/balance.py)."""
    devices = list(devices if devices is not None else jax.devices())
    wanted = config_lib.device_count(config, len(devices))
    if wanted < len(devices):
        logger.info(f"using the first {wanted} of {len(devices)} devices")
        devices = devices[:wanted]
    shape = parallel.validate(config, len(devices))
    mesh = mesh_lib.make_mesh(shape, devices)
    dataset = data_lib.load(config)
    spec = dataset.spec
    model = models.build(config.model, spec.image_shape, spec.num_classes)
    parallel.check_model(config, shape, model)  # the refusals only the model tells
    if config.pipeline.num_microbatches == 0:  # chosen by timing (pipeline/microbatches.py)
        config = config.copy_and_resolve_references()
        config.pipeline.num_microbatches = (
            microbatches.choose_microbatches(model, config, mesh, workdir)
            if axes.num_stages(shape) > 1
            else 1
        )
        parallel.validate(config, len(devices))
    if axes.num_stages(shape) > 1 and stages.parse(config.pipeline.split) == "time":
        model = dataclasses.replace(model, times=balance.measure(model, config, mesh, workdir))
    tx = optim.make_optimizer(config)
    strategy = parallel.build(config, model, mesh, tx)
    return Setup(config, mesh, dataset, model, strategy, optim.make_schedule(config))


def local_train_batch(setup: Setup, step: int) -> dict[str, np.ndarray]:
    """This process's share of global batch `step` (deterministic in seed and step)."""
    share = setup.strategy.batch_share()
    return setup.dataset.train_batch(
        step, setup.config.global_batch_size, *share, example_ids=setup.model.stochastic
    )


def evaluate(
    setup: Setup, state, watch: watchdog_lib.Watchdog | None = None, dataset=None
) -> dict[str, float]:
    """Loss and accuracy over the whole eval split (the padded last batch is masked) of
    `dataset` (the run's own by default)."""
    batch_size = setup.config.eval_batch_size or setup.config.global_batch_size
    dataset = dataset or setup.dataset
    totals = None
    for i, local in enumerate(dataset.eval_batches(batch_size, *setup.strategy.batch_share())):
        # Every computation is counted in the strategy's dispatch window (dispatch.py).
        sums = setup.strategy.eval_step(state, setup.strategy.put_batch(local))
        totals = sums if totals is None else setup.strategy.inflight.add(add_sums(totals, sums))
        if watch is not None:
            watch.beat(f"evaluation batch {i + 1}")
    totals = jax.device_get(totals)
    count = max(float(totals["count"]), 1.0)
    out = {
        "loss": float(totals["loss_sum"]) / count,
        "accuracy": float(totals["correct"]) / count,
        "count": int(totals["count"]),  # images evaluated (padding excluded)
    }
    if "replica_correct" in totals:  # independent replicas: replica 0 above, and the spread
        per_replica = np.asarray(totals["replica_correct"]) / count
        out.update(accuracy_min=float(per_replica.min()), accuracy_max=float(per_replica.max()))
    return out


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
        result = _run(_Run(built, workdir, watch, wall0, profile, compiled), eval_only)
    cluster.finish()  # several processes: every one is past its last collective
    return result


@dataclasses.dataclass(frozen=True)
class _Run:
    """One call of `train_and_evaluate`: what it is built from and what it reports to (what
    it says goes to the "jaxpar" logger: jaxpar/log.py)."""

    setup: Setup
    workdir: str
    watch: watchdog_lib.Watchdog
    wall0: float  # when it started (perf_counter)
    profile: bool
    compiled: compile_cache.Counts  # the programs this process had built when it started


def _run(run: _Run, eval_only: bool) -> dict[str, Any]:
    """Resume or start, compile, train and summarise."""
    setup, watch = run.setup, run.watch
    config, total = setup.config, setup.config.num_train_steps
    _announce(setup)
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
        if restored is not None and (restored[1] >= total or _ended_at_target(run, restored[1])):
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
        logger.info(
            f"compiled the train step in {units.seconds(setup.strategy.compile_time_s)} "
            f"({step_programs.said()}); training steps {start + 1}-{total} of "
            f"{config.global_batch_size} images"
        )
        outcome = _train(run, state, first, start, writer, ckpt)
        if ckpt is not None:  # the last save is complete (or its failure raised) before the report
            watch.doing("waiting for the last checkpoint to be written")
            ckpt.close()
        return _summarise(run, outcome, writer, step_programs)


@dataclasses.dataclass
class _Outcome:
    """What the step loop leaves for the summary."""

    state: Any
    step_times: list[float]
    feed: InputStats  # the host time of each prefetched batch and the loop's wait for it
    train: dict[str, float]  # the last train line
    evaluation: dict[str, float]  # the last evaluation
    stopped: bool  # by a stop request, before the last step
    last_step: int  # the step the run ended after (num_train_steps, or the target's)
    extra: dict[str, Any]  # the noise scale's and the target's summary figures


def _train(run: _Run, state, first, start: int, writer, ckpt) -> _Outcome:
    """Steps `start + 1`..`num_train_steps` (`first` is the batch of the first), each followed
    by the hooks; saves and ends early when a stop is requested."""
    setup, watch = run.setup, run.watch
    config, total = setup.config, setup.config.num_train_steps
    is_lead = jax.process_index() == 0
    timer = hooks.StepTimer(watch)
    progress = console.Progress(total, start_step=start) if is_lead else None
    feed = InputStats()  # what each batch cost the host and the loop's wait for it
    noise = _noise_tracker(setup, run.workdir, start)
    window = hooks.LogWindow(
        writer, progress, setup.schedule, config.global_batch_size, timer, ckpt, feed, noise
    )
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
                total,
                stats=feed,
            )
        )
        for i, batch in itertools.chain([(start, first)], batches):
            tracer.before(i, state)
            watch.doing(f"running step {i + 1}")
            state, metrics = setup.strategy.train_step(state, batch)
            watchdog_lib.injected_hang(i + 1)
            tracer.after(i, (state, metrics))
            timer.dispatched(i + 1, metrics)
            window.add(metrics)
            # Every process asks every step: they agree on the step to stop at.
            info = hooks.StepInfo(i + 1, state, final=i + 1 == total, stopping=stop.check(i + 1))
            after_step.run(info)
            if info.stopping and not info.final:
                logger.info(stop.stopped_line(info.step, ckpt))  # which step it saved, if any
                break
            if evaluation.reached_now and config.stop_at_target and not info.final:
                _end_at_target(info, window, saver)
                break
    stopped = info.stopping and not info.final
    extra = goal.summary(info.step, evaluation.seconds, evaluation.count)
    # what a plan from this run (jaxpar/plan/steps.py) needs to know of its learning rate
    extra.update(
        lr_rule=optim.batch_rule(config),
        peak_learning_rate=optim.peak_learning_rate(config),
        lr_base_batch_size=config.lr_base_batch_size,
        sync_mode=config.sync.mode,
    )
    if noise is not None:
        extra.update(noise.summary(goal.reached_step))
    return _Outcome(
        state, timer.times, feed, window.last, evaluation.last, stopped, info.step, extra
    )


def _ended_at_target(run: _Run, step: int) -> bool:
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


def _summarise(
    run: _Run,
    outcome: _Outcome,
    writer: metrics_lib.MetricWriter,
    step_programs: compile_cache.Counts,
) -> dict[str, Any]:
    """The summary record (written and shown unless the run was stopped), with the state;
    `step_programs`: what compiling the train step built."""
    setup = run.setup
    jax.block_until_ready(outcome.state)
    report = _strategy_report(setup)
    summary = metrics_lib.summary(
        strategy=setup.strategy.name,
        mesh_shape=tuple(int(v) for v in setup.mesh.devices.shape),
        mesh_axes=tuple(setup.mesh.axis_names),
        partitioning=setup.strategy.partitioning(),
        steps=outcome.last_step,
        global_batch_size=setup.config.global_batch_size,
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
    summary.update(_epochs(setup, summary))
    summary.update(outcome.extra)
    summary.update(compile_cache.summary(step_programs, compile_cache.counts() - run.compiled))
    if outcome.stopped:
        summary["preempted"] = True
    else:
        summary.update(_train_split(run, outcome.state, summary))
        writer.write(outcome.last_step, "summary", **summary)
        logger.info(console.summary_table(summary))
        logger.info(f"metrics: {run.workdir}/metrics.jsonl")
    summary["state"] = setup.strategy.canonical(outcome.state)
    return summary


def _epochs(setup: Setup, summary: dict[str, Any]) -> dict[str, Any]:
    """How much of the train split the run saw: its size, epochs, and seconds per epoch at
    the measured rate."""
    n = setup.dataset.spec.num_train
    out = {
        "train_examples": n,
        "epochs": summary["steps"] * setup.config.global_batch_size / n,
    }
    if summary.get("images_per_sec"):
        out["seconds_per_epoch"] = n / summary["images_per_sec"]
    return out


def _train_split(run: _Run, state, summary: dict[str, Any]) -> dict[str, Any]:
    """With eval_train_examples: the final model evaluated on that many train images (the
    train accuracy) and the train/test gap in accuracy; else nothing."""
    n = run.setup.config.eval_train_examples
    if not n:
        return {}
    run.watch.doing("evaluating the train split", compiling=False)
    result = evaluate(run.setup, state, run.watch, run.setup.dataset.train_as_eval(n))
    out = {
        "train_eval_loss": result["loss"],
        "train_eval_accuracy": result["accuracy"],
        "train_eval_examples": result["count"],
        "generalization_gap": result["accuracy"] - summary["eval_accuracy"],
    }
    logger.info(
        f"train split ({result['count']:,} images, inference mode): loss {result['loss']:.4f}  "
        f"accuracy {result['accuracy']:.4f}  gap to test {out['generalization_gap']:+.4f}"
    )
    return out


def _strategy_report(setup: Setup) -> dict[str, Any]:
    """The strategy's figures of a step (memory, collectives, pipeline) for the summary: the
    one place the trainer asks for them."""
    return analysis.report(setup.strategy, setup.config.global_batch_size)


def _announce(setup: Setup) -> None:
    spec, mesh, strategy = setup.dataset.spec, setup.mesh, setup.strategy
    logger.info(
        f"jaxpar: {setup.model.name} on {spec.name} {spec.image_shape}, "
        f"mesh {units.named_mesh(mesh.axis_names, mesh.devices.shape)} over "
        f"{mesh.devices.size} {jax.default_backend()} devices: {strategy.partitioning()}, "
        f"run by strategy {strategy.name}"
    )
    logger.info(setup.model.summary())
    if described := setup.strategy.describe(setup.config.global_batch_size):
        logger.info(described)


def _evaluate_only(run: _Run, restored) -> dict[str, Any]:
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
