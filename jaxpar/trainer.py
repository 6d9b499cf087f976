"""The training loop: build the state, step, evaluate, log. `train_and_evaluate` is the API."""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxpar import checkpoint as checkpoint_lib
from jaxpar import config as config_lib
from jaxpar import data as data_lib
from jaxpar import mesh as mesh_lib
from jaxpar import metrics as metrics_lib
from jaxpar import models, optim, parallel

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
    """Validate, then build mesh, data, model and strategy (nothing compiled yet)."""
    devices = list(devices if devices is not None else jax.devices())
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
    return s.dataset.train_batch(
        step, s.config.global_batch_size, jax.process_index(), jax.process_count()
    )


def evaluate(s: Setup, state) -> dict[str, float]:
    """Loss and accuracy over the whole eval split (the padded last batch is masked)."""
    batch_size = s.config.eval_batch_size or s.config.global_batch_size
    totals = None
    for local in s.dataset.eval_batches(batch_size, jax.process_index(), jax.process_count()):
        sums = s.strategy.eval_step(state, s.strategy.put_batch(local))
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    totals = jax.device_get(totals)
    count = max(float(totals["count"]), 1.0)
    out = {"loss": float(totals["loss_sum"]) / count, "accuracy": float(totals["correct"]) / count}
    if "replica_correct" in totals:  # [sync] independent replicas: replica 0 above, and spread
        per_replica = np.asarray(totals["replica_correct"]) / count
        out.update(accuracy_min=float(per_replica.min()), accuracy_max=float(per_replica.max()))
    return out


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    devices: Sequence[jax.Device] | None = None,
) -> dict[str, Any]:
    """Train `config` in `workdir`; write metrics.jsonl and TensorBoard files; return summary."""
    wall0 = time.perf_counter()
    s = setup(config, devices)
    is_lead = jax.process_index() == 0
    say = print if is_lead else (lambda *a, **k: None)
    num_devices = s.mesh.devices.size
    mesh_shape = tuple(int(v) for v in s.mesh.devices.shape)
    say(
        f"jaxpar: {s.model.name} on {s.dataset.spec.name} {s.dataset.spec.image_shape}, "
        f"mesh (data, stage, tensor) = {mesh_shape} over {num_devices} {jax.default_backend()} "
        f"devices, strategy {s.strategy.name}"
    )
    say(s.model.summary())
    if hasattr(s.strategy, "describe"):
        say(s.strategy.describe(config.global_batch_size))

    ckpt = None
    start = 0
    if config.checkpoint_every_steps:
        ckpt = checkpoint_lib.Checkpointer(
            workdir, config, s.model, config.checkpoint_every_steps, config.checkpoint.max_to_keep
        )
        restored = ckpt.restore(s.strategy.host_target())
    else:
        restored = None
    if restored is not None:
        host_state, start = restored
        state = s.strategy.place(host_state)
        say(f"resumed from the checkpoint of step {start} in {ckpt.directory}")
    else:
        state = s.strategy.init_state(jax.random.key(config.seed))
    writer = metrics_lib.MetricWriter(workdir, enabled=is_lead, resume_step=start)
    total = config.num_train_steps
    first_step = min(start, total - 1)
    first = s.strategy.put_batch(local_train_batch(s, first_step))
    s.strategy.compile(state, first)
    say(
        f"compiled the train step in {s.strategy.compile_time_s:.1f} s; training steps "
        f"{start + 1}-{total} of {config.global_batch_size} images"
    )
    stop = _Preemption()

    progress = metrics_lib.Progress(total, start_step=start)
    step_times: list[float] = []
    window: list[dict] = []
    window_t0, last_done = time.perf_counter(), None
    pending = None  # metrics of the step in flight: we sync one step behind to time steps
    eval_metrics: dict[str, float] = {}
    train_line: dict[str, float] = {}
    preempted = False
    with data_lib.Prefetcher(
        lambda i: local_train_batch(s, i), s.strategy.put_batch, start + 1, total
    ) as batches:
        stream = _chain([(start, first)] if start < total else [], batches)
        for i, batch in stream:
            state, metrics = s.strategy.train_step(state, batch)
            if pending is not None:
                jax.block_until_ready(pending)
                now = time.perf_counter()
                if last_done is not None:
                    step_times.append(now - last_done)
                last_done = now
            pending = metrics
            window.append(metrics)
            done = i + 1
            if done % config.log_every_steps == 0 or done == total:
                jax.block_until_ready(metrics)
                now = time.perf_counter()
                fetched = jax.device_get(window)
                train_line = {
                    "loss": float(np.mean([m["loss"] for m in fetched])),
                    "accuracy": float(np.mean([m["accuracy"] for m in fetched])),
                    "learning_rate": float(s.schedule(i)),
                    "images_per_sec": len(window) * config.global_batch_size / (now - window_t0),
                }
                writer.write(done, "train", **train_line)
                if is_lead:
                    progress.update(
                        done,
                        **{
                            "loss": train_line["loss"],
                            "lr": train_line["learning_rate"],
                            "img/s": train_line["images_per_sec"],
                        },
                    )
                window, window_t0 = [], time.perf_counter()
            if done == total or (config.eval_every_steps and done % config.eval_every_steps == 0):
                eval_metrics = evaluate(s, state)
                writer.write(done, "eval", **eval_metrics)
                say(
                    f"eval at step {done}: loss {eval_metrics['loss']:.4f}  "
                    f"accuracy {eval_metrics['accuracy']:.4f}"
                )
                window_t0 = time.perf_counter()  # keep eval time out of the train rate
                pending, last_done = None, None  # and out of the step times
            if ckpt is not None:
                force = done == total or stop.asked
                if force or done % config.checkpoint_every_steps == 0:  # [sync] canonical
                    ckpt.save(done, s.strategy.canonical(state), force=force)  # only to save
            if stop.asked and done < total:
                say(f"SIGTERM: saved the checkpoint of step {done}; stopping (rerun to resume)")
                preempted = True
                break
    stop.restore()
    if ckpt is not None:
        ckpt.close()
    jax.block_until_ready(state)
    if start >= total:  # nothing left to train: report the restored model
        eval_metrics = evaluate(s, state)
    extra = {}
    if hasattr(s.strategy, "report"):
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


class _Preemption:
    """Turns SIGTERM into a request to checkpoint and stop after the current step."""

    def __init__(self):
        self.asked = False
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._ask)

    def _ask(self, signum, frame):
        self.asked = True

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def _chain(*iterables):
    for it in iterables:
        yield from it
