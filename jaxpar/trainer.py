"""The training loop: build the state, step, evaluate, log. `train_and_evaluate` is the API."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from jaxpar import checkpoint as checkpoint_lib
from jaxpar import cluster, models, optim, parallel, profiling
from jaxpar import config as config_lib
from jaxpar import data as data_lib
from jaxpar import mesh as mesh_lib
from jaxpar import metrics as metrics_lib
from jaxpar import watchdog as watchdog_lib
from jaxpar import workdir as workdir_lib
from jaxpar.errors import ConfigError, TrainingError
from jaxpar.parallel.common import add_sums

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
        return self.mesh.shape["data"]


def setup(config: ml_collections.ConfigDict, devices: Sequence[jax.Device] | None = None) -> Setup:
    """Validate, then build mesh, data, model and strategy (nothing compiled yet).

    `config.num_devices` > 0 uses only the first N of the devices (like tf_cnn_benchmarks'
    --num_gpus): one line says so."""
    devices = list(devices if devices is not None else jax.devices())
    wanted = config_lib.device_count(config, len(devices))
    if wanted < len(devices):
        if jax.process_index() == 0:
            print(f"using the first {wanted} of {len(devices)} devices")
        devices = devices[:wanted]
    shape = config_lib.validate(config, len(devices))
    mesh = mesh_lib.make_mesh(shape, devices)
    dataset = data_lib.load(config)
    spec = dataset.spec
    model = models.build(config.model, spec.image_shape, spec.num_classes)
    tx = optim.make_optimizer(config)
    strategy = parallel.build(config, model, mesh, tx)
    return Setup(config, mesh, dataset, model, strategy, optim.make_schedule(config))


def local_train_batch(s: Setup, step: int) -> dict[str, np.ndarray]:
    """This process's share of global batch `step` (deterministic in seed and step)."""
    return s.dataset.train_batch(step, s.config.global_batch_size, *s.strategy.batch_share())


def evaluate(s: Setup, state, watch: watchdog_lib.Watchdog | None = None) -> dict[str, float]:
    """Loss and accuracy over the whole eval split (the padded last batch is masked)."""
    batch_size = s.config.eval_batch_size or s.config.global_batch_size
    totals = None
    for i, local in enumerate(s.dataset.eval_batches(batch_size, *s.strategy.batch_share())):
        # Every computation is counted in the strategy's dispatch window (dispatch.py).
        sums = s.strategy.eval_step(state, s.strategy.put_batch(local))
        totals = sums if totals is None else s.strategy.inflight.add(add_sums(totals, sums))
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
    s = setup(config, devices)
    is_lead = jax.process_index() == 0
    say = print if is_lead else (lambda *a, **k: None)
    if is_lead:
        workdir_lib.prepare(workdir)
    lock = workdir_lib.Lock(workdir) if is_lead else contextlib.nullcontext()
    with lock, watchdog_lib.Watchdog(config.hang_timeout_s, config.stop_grace_s) as watch:
        result = _run(s, config, workdir, wall0, say, is_lead, eval_only, profile, watch)
    cluster.finish()  # several processes: every one is past its last collective
    return result


def _run(
    s: Setup, config, workdir: str, wall0: float, say, is_lead: bool, eval_only: bool, profile,
    watch: watchdog_lib.Watchdog,
):  # fmt: skip
    num_devices = s.mesh.devices.size
    mesh_shape = tuple(int(v) for v in s.mesh.devices.shape)
    say(
        f"jaxpar: {s.model.name} on {s.dataset.spec.name} {s.dataset.spec.image_shape}, "
        f"mesh (data, stage, tensor) = {mesh_shape} over {num_devices} {jax.default_backend()} "
        f"devices, strategy {s.strategy.name}"
    )
    say(s.model.summary())
    if described := s.strategy.describe(config.global_batch_size):
        say(described)

    ckpt = None
    start = 0
    restored = None
    if config.checkpoint_every_steps or eval_only:
        ckpt = checkpoint_lib.Checkpointer(
            workdir, config, s.model, config.checkpoint_every_steps, config.checkpoint.max_to_keep
        )
        watch.doing("restoring the newest checkpoint", compiling=True)
        restored = ckpt.restore(s.strategy.host_target())
    total = config.num_train_steps
    if eval_only:
        return _evaluate_only(s, ckpt, restored, workdir, say, watch)
    if restored is not None and restored[1] >= total:
        ckpt.close()
        return _finished(workdir, restored[1], config, say)
    if restored is not None:
        host_state, start = restored
        _check_schedule(config, ckpt, start, say)
        state = s.strategy.place(host_state)
        say(f"resumed from the checkpoint of step {start} in {ckpt.directory}")
    else:
        state = s.strategy.init_state(jax.random.key(config.seed))
    writer = metrics_lib.MetricWriter(workdir, enabled=is_lead, resume_step=start)
    if writer.archived:
        say(
            f"{workdir} held metrics of an earlier run that left no checkpoint; they are kept "
            f"in {writer.archived}"
        )
    first = s.strategy.put_batch(local_train_batch(s, start))
    watch.doing("compiling the train step", compiling=True)
    s.strategy.compile(state, first)
    watch.beat("compiling the train step")
    say(
        f"compiled the train step in {s.strategy.compile_time_s:.1f} s; training steps "
        f"{start + 1}-{total} of {config.global_batch_size} images"
    )
    stop = _Preemption(say, watch)

    progress = metrics_lib.Progress(total, start_step=start)
    tracer = profiling.StepTrace(workdir, start + TIMING_WARMUP_STEPS, total, profile and is_lead)
    step_times: list[float] = []
    window: list[dict] = []
    window_t0, last_done = time.perf_counter(), None
    pending = None  # metrics of the step in flight: we sync one step behind to time steps
    eval_metrics: dict[str, float] = {}
    train_line: dict[str, float] = {}
    preempted = False
    try:
        with data_lib.Prefetcher(
            lambda i: local_train_batch(s, i), s.strategy.put_batch, start + 1, total
        ) as batches:
            for i, batch in _chain([(start, first)], batches):
                tracer.before(i, state)
                watch.doing(f"running step {i + 1}")
                state, metrics = s.strategy.train_step(state, batch)
                watchdog_lib.injected_hang(i + 1)
                tracer.after(i, (state, metrics))
                if pending is not None:
                    jax.block_until_ready(pending)
                    watch.beat(f"step {i}")
                    now = time.perf_counter()
                    if last_done is not None:
                        step_times.append(now - last_done)
                    last_done = now
                pending = metrics
                window.append(metrics)
                done = i + 1
                stopping = stop.check(done)  # every process, every step (agreed across them)
                if stopping:
                    watch.stopping()
                if done % config.log_every_steps == 0 or done == total:
                    jax.block_until_ready(metrics)
                    watch.beat(f"step {done}")
                    now = time.perf_counter()
                    fetched = jax.device_get(window)
                    train_line = {
                        "loss": float(np.mean([m["loss"] for m in fetched])),
                        "accuracy": float(np.mean([m["accuracy"] for m in fetched])),
                        "learning_rate": float(s.schedule(i)),
                        "images_per_sec": len(window)
                        * config.global_batch_size
                        / (now - window_t0),
                    }
                    writer.write(done, "train", **train_line)
                    if is_lead:
                        progress.update(
                            done,
                            loss=train_line["loss"],
                            lr=train_line["learning_rate"],
                            **{"img/s": train_line["images_per_sec"]},
                        )
                    _stop_if_diverged(fetched, done, ckpt)
                    window, window_t0 = [], time.perf_counter()
                if done == total or (
                    config.eval_every_steps and done % config.eval_every_steps == 0
                ):
                    watch.doing(f"evaluating at step {done}", compiling=not eval_metrics)
                    eval_metrics = evaluate(s, state, watch)
                    writer.write(done, "eval", **eval_metrics)
                    say(
                        f"eval at step {done}: loss {eval_metrics['loss']:.4f}  "
                        f"accuracy {eval_metrics['accuracy']:.4f}"
                    )
                    window_t0 = time.perf_counter()  # keep eval time out of the train rate
                    pending, last_done = None, None  # and out of the step times
                if ckpt is not None and ckpt.due(done, force=done == total or stopping):
                    t0 = time.perf_counter()
                    watch.doing(f"saving the checkpoint of step {done}", compiling=True)
                    _stop_if_diverged(jax.device_get(window), done, ckpt)
                    canonical = s.strategy.canonical(state)
                    if not _all_finite((canonical.params, canonical.batch_stats)):
                        raise _diverged(done, "the parameters", ckpt)
                    ckpt.save(done, canonical, optim.schedule_meta(config))
                    watch.beat(f"the checkpoint of step {done}")
                    window_t0 += time.perf_counter() - t0  # keep saves out of the rate
                    pending, last_done = None, None  # and out of the step times
                if stopping and done < total:
                    say(
                        f"{stop.signal_name}: saved the checkpoint of step {done}; stopped. "
                        "Run the same command again to resume."
                        if ckpt is not None
                        else f"{stop.signal_name}: stopped at step {done} (checkpoints are off, "
                        "so a rerun starts again)"
                    )
                    preempted = True
                    break
    except BaseException:
        tracer.stop()
        stop.restore()
        writer.close()
        if ckpt is not None:  # let a save in progress finish: it is a good checkpoint
            with contextlib.suppress(Exception):
                ckpt.close()
        raise
    tracer.stop()
    stop.restore()
    if ckpt is not None:
        watch.doing("waiting for the last checkpoint to be written")
        ckpt.close()
    jax.block_until_ready(state)
    extra = s.strategy.report(state, first, config.global_batch_size)

    stats = metrics_lib.throughput(step_times, config.global_batch_size, TIMING_WARMUP_STEPS)
    summary = {
        "strategy": s.strategy.name,
        "num_devices": num_devices,
        "mesh_shape": mesh_shape,
        "steps": total,
        "global_batch_size": config.global_batch_size,
        **stats,
        "compile_time_s": s.strategy.compile_time_s,
        "wall_time_s": time.perf_counter() - wall0,
        "final_loss": train_line.get("loss", float("nan")),
        "eval_loss": eval_metrics.get("loss", float("nan")),
        "eval_accuracy": eval_metrics.get("accuracy", float("nan")),
        "num_params": s.model.num_params,
        "model_flops_per_image": 3 * s.model.flops_per_example,  # forward + backward
        **extra,
    }
    if "images_per_sec" in stats:
        summary["model_tflops_per_sec"] = (
            summary["images_per_sec"] * summary["model_flops_per_image"] / 1e12
        )
    if preempted:
        writer.close()
        summary["preempted"] = True
        summary["state"] = s.strategy.canonical(state)
        return summary
    writer.write(total, "summary", **summary)
    writer.close()
    say(metrics_lib.summary_table(summary))
    if is_lead:
        say(f"metrics: {workdir}/metrics.jsonl")
    summary["state"] = s.strategy.canonical(state)
    return summary


def _finished(workdir: str, step: int, config, say) -> dict[str, Any]:
    """A rerun of a finished run: say so, show its summary, change nothing."""
    summary = metrics_lib.last_summary(workdir) or {}
    span = optim.schedule_steps(config)
    say(
        f"the run in {workdir} is finished: its checkpoint is at step {step} of "
        f"{config.num_train_steps}; nothing to train. To continue, raise "
        f"--config.num_train_steps and add --config.schedule_steps={span} to keep its "
        "learning-rate schedule (the rate stays at its end value) or a larger value to stretch "
        "it; or add --eval_only to evaluate"
    )
    if summary:
        say(metrics_lib.summary_table(summary))
    return {**summary, "finished": True}


def _check_schedule(config, ckpt, start: int, say) -> None:
    """Continuing a run must not change the learning rate of its steps behind the user's back:
    a schedule whose rate differs at any step (usually a raised num_train_steps stretching the
    cosine) is refused in one line unless `schedule_steps` is given explicitly, and then said
    plainly."""
    before = ckpt.restored_meta.get("schedule")
    if not before or before == optim.schedule_meta(config):
        return
    steps = jnp.arange(config.num_train_steps)
    old = np.asarray(optim.make_schedule(_with_schedule(config, before))(steps))
    new = np.asarray(optim.make_schedule(config)(steps))
    differ = np.flatnonzero(~np.isclose(old, new, rtol=1e-6, atol=0.0))
    if differ.size == 0:  # e.g. a constant rate over a longer run: nothing changes
        return
    at = int(differ[0])
    rates = f"the rate at step {at + 1} is {new[at]:.3g} instead of {old[at]:.3g}"
    if config.schedule_steps:  # asked for explicitly: go on, and say what changes
        say(f"learning-rate schedule changed on resuming at step {start}: {rates}")
        return
    raise ConfigError(
        f"this run was trained on a {before['schedule_steps']}-step {before['lr_schedule']} "
        f"learning-rate schedule, and this config changes it: {rates}. Keep the old one with "
        f"--config.schedule_steps={before['schedule_steps']} (and the run's other "
        "learning-rate settings), or accept the new one with --config.schedule_steps="
        f"{optim.schedule_steps(config)}"
    )


def _with_schedule(config, meta: dict):
    """`config` with the learning-rate settings of a checkpoint's schedule record."""
    old = config.copy_and_resolve_references()
    with old.unlocked():
        old.lr_schedule, old.warmup_steps = meta["lr_schedule"], meta["warmup_steps"]
        old.learning_rate, old.lr_linear_scaling = meta["peak_learning_rate"], False
        old.schedule_steps = meta["schedule_steps"]
    return old


def _evaluate_only(s: Setup, ckpt, restored, workdir: str, say, watch) -> dict[str, Any]:
    """Evaluate the newest checkpoint; write nothing."""
    ckpt.close()
    if restored is None:
        raise TrainingError(f"--eval_only needs a checkpoint, and {workdir} has none; train first")
    host_state, step = restored
    watch.doing(f"evaluating the checkpoint of step {step}", compiling=True)
    result = evaluate(s, s.strategy.place(host_state), watch)
    say(
        f"eval of the checkpoint of step {step}: loss {result['loss']:.4f}  "
        f"accuracy {result['accuracy']:.4f}"
    )
    return {"step": step, "eval_loss": result["loss"], "eval_accuracy": result["accuracy"]}


def _all_finite(tree) -> bool:
    """Whether every array of `tree` is finite: one compiled reduction per set of devices
    (a pipeline's stages hold their arrays on different devices)."""
    groups: dict[frozenset, list] = {}
    for leaf in jax.tree.leaves(tree):
        groups.setdefault(frozenset(leaf.sharding.device_set), []).append(leaf)
    flags = [_finite(arrays) for arrays in groups.values()]
    return bool(np.all(jax.device_get(flags)))


@jax.jit
def _finite(arrays: list) -> jax.Array:
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in arrays]))


def _stop_if_diverged(fetched: list[dict], done: int, ckpt) -> None:
    """Raise TrainingError if any loss of the last steps (ending at step `done`) is not finite."""
    losses = [float(m["loss"]) for m in fetched]
    bad = [j for j, value in enumerate(losses) if not np.isfinite(value)]
    if bad:
        step = done - len(losses) + 1 + bad[0]
        raise _diverged(step, f"the loss ({losses[bad[0]]})", ckpt)


def _diverged(step: int, what: str, ckpt) -> TrainingError:
    if ckpt is None:
        where = "checkpoints are off, so nothing was saved"
    else:
        ckpt.wait()
        last = ckpt.latest_step()
        where = (
            f"the last good checkpoint is step {last} in {ckpt.directory} (a rerun resumes there)"
            if last is not None
            else "no checkpoint had been saved yet"
        )
    return TrainingError(
        f"training diverged: {what} is not finite at step {step}; {where}. Lower "
        "--config.learning_rate (or add warmup) and rerun"
    )


class _Preemption:
    """Turns SIGTERM and SIGINT (Ctrl-C) into a request to checkpoint and stop after the
    current step. A second SIGINT aborts at once (KeyboardInterrupt).

    Several processes must stop at the same step, whichever of them was signalled: there a
    SIGTERM goes to JAX's preemption sync manager (it installs its own handler), a SIGINT is
    handed to it as a SIGTERM, and `check` asks it whether this step is the one the processes
    agreed on (`multihost_utils.reached_preemption_sync_point`, called every step)."""

    def __init__(self, say=print, watch: watchdog_lib.Watchdog | None = None):
        self.watch = watch
        self.asked = False
        self.signal_name = ""
        self._say = say
        self._previous: dict = {}
        self.multi = jax.process_count() > 1
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT,) if self.multi else (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._ask)

    def _ask(self, signum, frame):
        name = signal.Signals(signum).name
        if self.asked and signum == signal.SIGINT:
            if self.watch is None:
                raise KeyboardInterrupt  # second Ctrl-C: stop now
            return  # the watchdog's thread stops the run at once, even a stuck one
        self.asked, self.signal_name = True, name
        if self.multi:  # tell every process, through JAX's preemption notifier
            os.kill(os.getpid(), signal.SIGTERM)
        self._say(
            f"{name}: finishing this step, then saving a checkpoint and stopping"
            + (" (Ctrl-C again aborts at once)" if signum == signal.SIGINT else ""),
            flush=True,
        )

    def check(self, step: int) -> bool:
        """Whether to save and stop after `step` (the same answer on every process)."""
        if not self.multi:
            return self.asked
        if multihost_utils.reached_preemption_sync_point(step):
            self.signal_name = self.signal_name or "preemption notice (SIGTERM)"
            return True
        return False

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}


def _chain(*iterables):
    for it in iterables:
        yield from it
