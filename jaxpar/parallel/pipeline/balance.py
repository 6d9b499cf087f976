"""Stages balanced by measured time (`pipeline.split="time"`): a short profiling pass.

FLOPs are not time: on CPUs VGG's first convolutions (few channels, large maps) run at a small
fraction of the rate of its middle ones, so a FLOP-balanced split leaves stage 0 three times
slower than the others, and every schedule's bubble inherits that. This pass times each layer
alone on the run's own devices at the run's micro-batch shape (rows per data replica), each
boundary's transfer between two of its devices, and hands the times to the exact dynamic
program of `stages.split`, which then minimises the slowest chunk's time including its sends.

Per layer it times, on one device of stage 0, the compiled forward (training mode) and the
compiled forward + backward (a VJP with respect to parameters and input): a chunk costs
forward + (forward + backward) per micro-batch when its backward recomputes (remat), and
forward + backward otherwise. Per boundary: `device_put` of the layer's output from stage 0's
device to stage 1's, twice (the activation forward, its gradient back). Tensor parallelism
inside a stage is not profiled: a layer runs unsplit on one device, which keeps the ratios
between layers for channel splits of even width.

The times are cached in WORKDIR/layer_times.json with what they were measured for (model,
shapes, dtype, devices, JAX version); a resumed run reuses them, a changed model or
micro-batch shape measures again (remat only changes how they add up, not what is timed). With several processes, process 0's times are used by all,
so every process cuts the same stages.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import time
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpar import axes, models, units
from jaxpar import mesh as mesh_lib

logger = logging.getLogger(__name__)

CACHE_FILE = "layer_times.json"
REPEATS = 7  # timed calls per program after a warm-up; the fastest is kept (as the bench)
SPREAD_S = 2.0  # the profiling rounds span at least this long


@dataclasses.dataclass(frozen=True)
class LayerTimes:
    """Measured seconds per micro-batch: per layer its forward and forward + backward, and
    per boundary (after layer i) the transfer of its output one way."""

    forward: tuple[float, ...]
    forward_backward: tuple[float, ...]
    send: tuple[float, ...]
    dispatch: float  # what every program costs besides its work (see _profile)
    remat: bool
    rows: int  # rows per data replica per micro-batch that were timed
    profile_s: float  # what the pass cost (0.0 if nothing was measured)
    source: str  # "measured" or the cache file it came from

    def layer_costs(self) -> list[float]:
        """Seconds of one micro-batch's F and B events per layer, as the chunk programs run
        them (with remat the backward recomputes the forward), less the per-program cost of
        the timed layer programs: a chunk pays that once per program, not once per layer."""
        d = self.dispatch
        if self.remat:
            return [
                max(f - d, 0.0) + max(fb - d, 0.0)
                for f, fb in zip(self.forward, self.forward_backward)
            ]
        return [max(fb - d, 0.0) for fb in self.forward_backward]

    def boundary_costs(self) -> list[float]:
        """Seconds a cut after layer i adds to its chunk: the activation sent on and its
        gradient received back (both move on the chunk's stage's clock in this model)."""
        return [2 * s for s in self.send]

    def chunk_times(self, bounds) -> list[float]:
        """Predicted seconds per micro-batch of each chunk [b_c, b_c+1), sends included."""
        cost, send = self.layer_costs(), self.boundary_costs()
        out = []
        for a, b in itertools.pairwise(bounds):
            sent = send[b - 1] if b < len(cost) else 0.0
            out.append(sum(cost[a:b]) + sent + 2 * self.dispatch)  # F and B: two programs
        return out


def cache_key(model: models.SequentialModel, config, rows: int, devices) -> dict[str, Any]:
    """What the times depend on: a changed entry measures again."""
    return {
        "model": model.name,
        "width": float(config.model.width),
        "batch_norm": bool(config.model.batch_norm),
        "dtype": str(config.model.dtype),
        "input_shape": list(model.input_shape),
        "num_classes": model.num_classes,
        "layers": [layer.name for layer in model.layers],
        "rows": rows,
        "device_kind": devices[0].device_kind,
        "platform": devices[0].platform,
        "jax": jax.__version__,
    }


def measure(model, config, mesh, workdir: str | None = None) -> LayerTimes:
    """The layers' times for `model` under `config` on `mesh` (read from WORKDIR's cache when
    it was measured for the same things); prints one line saying what it did and cost."""
    rows = config.global_batch_size // max(config.pipeline.num_microbatches, 1)
    shape = dict(mesh.shape)
    rows = max(rows // axes.num_replicas(shape), 1)
    devices = list(mesh.devices.flat)
    src = devices[0]
    stage = axes.stage_axis(shape)
    # the first device of stage 1: a stage-to-stage move is timed between src and it
    dst = devices[mesh_lib.first_device(shape, {stage: 1})] if axes.num_stages(shape) > 1 else src
    key = cache_key(model, config, rows, devices)
    path = os.path.join(workdir, CACHE_FILE) if workdir else None
    times = _read(path, key, bool(config.pipeline.remat))
    if times is None:
        times = _profile(model, config, rows, src, dst)
        if path and jax.process_index() == 0:
            try:
                _write(path, key, times)
            except OSError:  # an unwritable workdir is reported by the run in one line
                path = None
    times = _agree(times)
    if times.source == "measured":
        where = f"; cached in {path}" if path else ""
        logger.info(
            f"pipeline.split=time: timed {len(model.layers)} layers at {rows} rows per "
            f"micro-batch in {units.seconds(times.profile_s)}{where}"
        )
    else:
        logger.info(
            f"pipeline.split=time: layer times reused from {times.source} (measured in "
            f"{units.seconds(times.profile_s)} for the same model, shapes and devices)"
        )
    return times


def _profile(model, config, rows: int, src, dst) -> LayerTimes:
    """Compile every layer's programs, then time them round-robin: REPEATS rounds over all
    layers, keeping each program's fastest call, so that a disturbance on the shared cores
    (or a cold start) spreads over every layer instead of inflating the few timed during it."""
    t0 = time.perf_counter()
    rng = jax.random.key(0)
    calls = []  # per layer: (forward, forward + backward, send), each a no-argument call
    for i, layer in enumerate(model.layers):
        layers = slice(i, i + 1)
        variables = jax.device_put(model.init(rng, layers), src)
        x = jax.device_put(jnp.zeros((rows, *layer.in_shape), jnp.float32), src)

        def fwd(params, stats, x, layers=layers):
            return model.apply(params, stats, x, train=True, layers=layers)[0]

        def fwd_bwd(params, stats, x, fwd=fwd, first=i == 0):
            if first:  # the first chunk takes no gradient with respect to the images
                y, vjp = jax.vjp(lambda p: fwd(p, stats, x), params)
            else:
                y, vjp = jax.vjp(lambda p, a: fwd(p, stats, a), params, x)
            return vjp(jnp.ones_like(y))

        args = (variables["params"], variables["batch_stats"], x)
        f, fb = jax.jit(fwd), jax.jit(fwd_bwd)
        y = jax.block_until_ready(f(*args))
        jax.block_until_ready(fb(*args))  # compile
        calls.append((partial(f, *args), partial(fb, *args), partial(jax.device_put, y, dst)))
    tiny = jax.device_put(jnp.zeros((8,), jnp.float32), src)
    plus_one = jax.jit(lambda a: a + 1)
    calls.append((partial(plus_one, tiny),))
    best = [[float("inf")] * len(c) for c in calls]
    rounds, began = 0, time.perf_counter()
    # The first round warms every program up; then at least REPEATS rounds and 2 seconds, so
    # that a disturbance shorter than that cannot set a layer's time.
    while rounds <= REPEATS or (time.perf_counter() - began < SPREAD_S and rounds < 200):
        for i, layer_calls in enumerate(calls):
            for j, call in enumerate(layer_calls):
                best[i][j] = min(best[i][j], _time_once(call))
        rounds += 1
    # What a program costs besides its work: at least a trivial program's call, and at most
    # the cheapest layer's forward (nearly all fixed cost for a small dense head). Timed one
    # by one, each layer pays it per program; fused into a chunk, once per program.
    layers_best = best[:-1]
    dispatch = max(best[-1][0], min(b[0] for b in layers_best))
    return LayerTimes(
        tuple(b[0] for b in layers_best),
        tuple(b[1] for b in layers_best),
        tuple(b[2] for b in layers_best),
        dispatch,
        bool(config.pipeline.remat),
        rows,
        time.perf_counter() - t0,
        "measured",
    )


def time_fastest(fn, args) -> float:
    """Smallest wall seconds of `fn(*args)` over REPEATS calls after a warm-up (compile):
    the least disturbed by other work on shared cores."""
    jax.block_until_ready(fn(*args))
    return min(_time_once(partial(fn, *args)) for _ in range(REPEATS))


def _time_once(call) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(call())
    return time.perf_counter() - t0


def _read(path: str | None, key: dict, remat: bool) -> LayerTimes | None:
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        if saved.get("key") != key:
            return None
        return LayerTimes(
            tuple(saved["forward"]),
            tuple(saved["forward_backward"]),
            tuple(saved["send"]),
            float(saved["dispatch"]),
            remat,
            int(key["rows"]),
            float(saved["profile_s"]),
            path,
        )
    except (OSError, ValueError, KeyError, TypeError):  # unreadable: measure again
        return None


def _write(path: str, key: dict, times: LayerTimes) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(
            {
                "key": key,
                "forward": times.forward,
                "forward_backward": times.forward_backward,
                "send": times.send,
                "dispatch": times.dispatch,
                "profile_s": times.profile_s,
            },
            f,
            indent=1,
        )
    os.replace(tmp, path)


def _agree(times: LayerTimes) -> LayerTimes:
    """Several processes: everyone takes process 0's times (measurements differ by noise,
    and every process must cut the same stages)."""
    if jax.process_count() == 1:
        return times
    from jax.experimental import multihost_utils

    n = len(times.forward)
    packed = np.array([*times.forward, *times.forward_backward, *times.send, times.dispatch])
    packed = np.asarray(multihost_utils.broadcast_one_to_all(packed), np.float64)
    return dataclasses.replace(
        times,
        forward=tuple(packed[:n]),
        forward_backward=tuple(packed[n : 2 * n]),
        send=tuple(packed[2 * n : 3 * n]),
        dispatch=float(packed[-1]),
    )
