"""The micro-batch count chosen by timing (`pipeline.num_microbatches=0`): the whole model timed
on one device at each count the batch allows, the schedule's events placed on that clock, the
shortest predicted step kept (and cached in the workdir, so a resumed run keeps its numerics).
The layer-by-layer pass for `pipeline.split="time"` is balance.py; this one reuses its cache
key and its timer.
"""

from __future__ import annotations

import json
import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxpar import axes, units
from jaxpar.parallel import schedules
from jaxpar.parallel.pipeline.balance import cache_key, time_fastest

logger = logging.getLogger(__name__)


def candidate_microbatches(config, data: int, k: int) -> list[int]:
    """Micro-batch counts the batch allows with `data` replicas on `k` stages: M divides each
    data replica's rows (so every micro-batch has a whole share per replica; the eval batch
    too), interleaved needs M a multiple of the stages and ZB-V at least K, and at most 8
    candidates (the largest kept)."""
    rows = config.global_batch_size // data
    eval_rows = (config.eval_batch_size or config.global_batch_size) // data
    out = [m for m in range(1, rows + 1) if rows % m == 0 and eval_rows % m == 0]
    if config.pipeline.schedule == "interleaved":
        out = [m for m in out if m % k == 0] or out
    if config.pipeline.schedule == "zb-v":
        out = [m for m in out if m >= k] or out
    if config.pipeline.schedule == "naive":
        out = [1]
    return out[-8:]


def choose_microbatches(model, config, mesh, workdir: str | None = None) -> int:
    """`_choose`, cached in WORKDIR/microbatches.json with what it was chosen for, so that a
    resumed run keeps its micro-batches (and its numerics) rather than re-measuring."""
    key = {
        **cache_key(model, config, 0, list(mesh.devices.flat)),
        "rows": None,
        "mesh": dict(mesh.shape),
        "batch": config.global_batch_size,
        "schedule": config.pipeline.schedule,
        "virtual_stages": config.pipeline.virtual_stages,
    }
    path = os.path.join(workdir, "microbatches.json") if workdir else None
    try:
        with open(path or "", encoding="utf-8") as f:
            saved = json.load(f)
        if saved.get("key") == key:
            logger.info(
                f"pipeline.num_microbatches=auto: M={saved['m']}, chosen by the first run "
                f"in this workdir ({path})"
            )
            return int(saved["m"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    m = _choose(model, config, mesh)
    if path and jax.process_index() == 0:
        try:
            os.makedirs(workdir, exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                json.dump({"key": key, "m": m}, f)
        except OSError:
            pass
    return m


def _choose(model, config, mesh) -> int:
    """The micro-batch count with the shortest predicted step (`pipeline.num_microbatches=0`).

    More micro-batches shrink the bubble ((K-1)/(M+K-1) for 1F1B) but each runs smaller
    programs, and below some size a program's time stops shrinking with its rows (fixed
    per-program and per-kernel costs). The pass times the whole model's forward + backward on
    one device at each candidate's rows per replica, gives each of the schedule's chunks an
    equal share of it (F : B : W = 1 : 2 : 0, or 1 : 1 : 1 when the schedule splits W off),
    and places the schedule's events on that clock. Memory does not bound M here: the stored
    activations of a step hold the same images however they are cut (GPipe), or fewer with
    more micro-batches (1F1B keeps at most K in flight)."""
    shape = dict(mesh.shape)
    data, k = axes.num_replicas(shape), axes.num_stages(shape)
    schedule, v = config.pipeline.schedule, config.pipeline.virtual_stages
    device = mesh.devices.flat[0]
    variables = jax.device_put(model.init(jax.random.key(0)), device)

    def loss(params, stats, x):
        return jnp.sum(model.apply(params, stats, x, train=True)[0])

    grad = jax.jit(jax.grad(loss))
    t0 = time.perf_counter()
    table = []
    for m in candidate_microbatches(config, data, k):
        rows = config.global_batch_size // data // m
        x = jax.device_put(jnp.zeros((rows, *model.input_shape), jnp.float32), device)
        per_mb = time_fastest(grad, (variables["params"], variables["batch_stats"], x))
        events = schedules.stage_events(schedule, k, m, v if schedule == "interleaved" else 1)
        c = schedules.num_chunks(events)
        split = schedules.split_backward(events)
        f = [per_mb / 3 / c] * c
        b = [per_mb / 3 / c if split else 2 * per_mb / 3 / c] * c
        w = [per_mb / 3 / c if split else 0.0] * c
        line = schedules.timeline(events, f, b, w)
        table.append((m, line.makespan, line.bubble, per_mb))
    best = min(table, key=lambda r: r[1])
    if jax.process_count() > 1:  # every process must cut the batch the same way
        from jax.experimental import multihost_utils

        chosen = int(multihost_utils.broadcast_one_to_all(np.int32(best[0])))
        best = next(r for r in table if r[0] == chosen)
    shown = ", ".join(f"M={m}: {units.seconds(t)}" for m, t, _, _ in table)
    reason = (
        "the largest the batch allows"
        if best is table[-1]
        else f"more micro-batches cost more per program than their smaller bubble saves "
        f"(bubble {best[2]:.3f} at M={best[0]})"
    )
    logger.info(
        f"pipeline.num_microbatches=auto: chose M={best[0]}, {reason}; predicted steps "
        f"{shown} (timed the model at {len(table)} micro-batch sizes in "
        f"{units.seconds(time.perf_counter() - t0)})"
    )
    return best[0]
