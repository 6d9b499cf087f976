"""Microbenchmarks of the local device that a profile of it prices with, each a property of the
device measured like a link's bandwidth, not fitted to any partitioning
(`python -m jaxpar.predict --calibrate ... --pool` runs them all).

Narrow matrix kernels (`measure_narrow`). A tensor-parallel step splits every convolution's
output features over the devices: VGG19 at width 0.25 over 8 devices runs convolutions of
2-16 output features. A matrix kernel computes in blocks (a GPU's tiles are 64-128 wide; a
CPU's GEMM kernel holds a few vector registers of 8 float32 each), so one whose narrowest GEMM
dimension n is small wastes part of every block: the profile prices it at n / (n +
narrow_width) of its class's rate (hardware.Profile). Measured: one 3x3 convolution layer's
training gradient (forward, input and weight gradients, on a batch of 64 16x16 maps of 32
features) with 2-64 output features, each compiled program's op classes read as the predictor
reads them (opclass.classify), and the narrow_width whose pricing matches the times best,
with one rate for all.

A kernel's fixed time (`measure_kernel`). Each kernel of a compiled program costs the device
something beyond its work (XLA:CPU: calling its function from the program's thunk sequence);
a profile prices it as kernel_s. Measured: a chain of tiny layers, `x = tanh(x @ w)` on 8 x 8
float32 (XLA:CPU runs the product and the tanh as two kernels, opclass counts them as the
predictor does), 16 and 256 layers long; the difference of the two programs' times over the
difference of their kernel counts, so the call's own dispatch drops out. About 0.43 us here
(2026-11-27): a profile that fits kernel_s to whole steps instead puts memory-bound work
there (cpu_2core.py: 7.0 us, memory-bound kernels priced at nothing).

Collectives inside the step on cores the devices share (`measure_collective_cpu`). This CPU's
8 simulated devices run on 2 cores, so a collective between a step's layers is work on those
cores: a tensor split's step burns 21 CPU-ms a device more than a data split's at the same
FLOPs, its cores busier, not idler (docs/predict.md, "Where the tensor rows' time goes").
Measured: on all the devices, layers of `x = tanh(conv(all_gather(x)))` (a column-parallel
layer) and of `x = tanh(psum(conv(x)))` (a row-parallel one), each beside the same program
with the collective replaced by local work of the same shape (the gathered copies made
locally; no sum), their process CPU time per call (time.process_time: every thread's); the
payload (each device's result of the collective) over the extra CPU time is the profile's
collective_cpu_rate. The payload, 1 MB a device, is the size of a tensor split's
collectives in the default suite (26.7 MB a device over 32 a step).

The forward pass (`measure_forward`). A pipeline runs each chunk's forward as a program of its
own. On XLA:CPU a training step's backward carries memory-bound work its FLOPs do not show
(transposed operands, reversed kernels, the max-pool gradient's index tensors), so rates fitted
to training steps overprice a forward-only program. Measured: the calibration run's model
forward (training-mode BatchNorm, as a pipeline runs it) on one device; the profile's
forward_speedup is its price at the fitted rates over its time.

The pipeline runner's host time (`measure_host`). One Python thread dispatches every stage's
programs and the stage-to-stage transfers, on the cores the simulated devices compute on.
Measured: the CPU time of that thread per training step (time.thread_time, not the wall
clock: it does not count the waits) of the calibration run's model at a quarter of its width
as a GPipe pipeline of K = 2, 4, 8 stages of one device, K = 2, 4 of two and K = 2 of four
(the mesh (D, K, 1)), over M = 1, 2, 4, 8 micro-batches; then the costs per stage, per
micro-batch and per program or transfer (2K - 1 programs and 2(K - 1) transfers per
micro-batch, as the predictor counts them), and what each further device of a stage adds per
stage and per dispatch (every argument is a buffer per device), that fit those times best,
beside the profile's fixed step_overhead_s. The quarter width leaves the devices' compute out of the thread's time
as far as it can: XLA:CPU runs part of a small program on the thread that calls it.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from typing import Any

from jaxpar.predict import opclass, timer

WIDTHS = (2, 4, 8, 16, 32, 64)


def _layer(batch: int, side: int, channels: int, width: int):
    import jax
    import jax.numpy as jnp

    def loss(w, x):
        y = jax.lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        return jnp.sum(y * y)

    x = jnp.ones((batch, side, side, channels), jnp.float32)
    w = jnp.ones((3, 3, channels, width), jnp.float32)
    fn = jax.jit(jax.grad(loss, argnums=(0, 1)))
    return fn.lower(w, x).compile(), (w, x)


def _seconds(compiled, args, seconds: float) -> float:
    """The least disturbed call's seconds (other jobs share these cores), each waited for."""
    return timer.measure(lambda: compiled(*args), seconds, min_calls=10).fastest


def fit(points: list[tuple[opclass.OpClasses, float]]) -> tuple[float, float]:
    """(narrow_width, FLOP/s): the width that prices every program's matrix kernels at
    n / (n + width) of one rate with the least squared log error over (op classes, seconds)."""
    best = None
    for step in range(64 * 4 + 1):
        d0 = step / 4
        work = [sum(m.flops * (m.narrow + d0) / m.narrow for m in ops.matmuls) for ops, _ in points]
        logs = [math.log(w / t) for w, (_, t) in zip(work, points)]
        rate = statistics.fmean(logs)
        err = sum((x - rate) ** 2 for x in logs)
        if best is None or err < best[0] - 1e-12:
            best = (err, d0, rate)
    _, d0, rate = best
    return d0, math.exp(rate)


def measure_narrow(
    widths=WIDTHS, batch: int = 64, side: int = 16, channels: int = 32, seconds: float = 0.5
) -> dict[str, Any]:
    """{"rates": {width: FLOP/s}, "narrow_width": d0, "flops_per_s": the fitted rate}."""
    points, rates = [], {}
    for width in widths:
        compiled, args = _layer(batch, side, channels, width)
        ops = opclass.classify(compiled.as_text())
        t = _seconds(compiled, args, seconds)
        points.append((ops, t))
        rates[width] = ops.flops / t
    d0, rate = fit(points)
    return {"rates": rates, "narrow_width": d0, "flops_per_s": rate}


def narrow_report(m: dict[str, Any]) -> str:
    rates = ", ".join(f"{n}: {r / 1e9:.1f}" for n, r in m["rates"].items())
    return (
        f"narrow matrix kernels (a 3x3 convolution's gradient, by output features; "
        f"GFLOP/s): {rates}\n  fitted: n / (n + {m['narrow_width']:g}) of "
        f"{m['flops_per_s'] / 1e9:.1f} GFLOP/s\n  c.narrow_width = {m['narrow_width']:g}"
    )


def _chain(layers: int, side: int = 8, device=None):
    """A program of `layers` tiny matrix kernels, each followed by an elementwise one (on
    `device`, or JAX's default)."""
    import jax
    import jax.numpy as jnp

    def chain(x, w):
        for _ in range(layers):
            x = jnp.tanh(x @ w)
        return x

    x = jnp.full((side, side), 0.01, jnp.float32)
    w = jnp.eye(side, dtype=jnp.float32) * 0.5
    if device is not None:
        x, w = jax.device_put((x, w), device)
    return jax.jit(chain).lower(x, w).compile(), (x, w)


def measure_kernel(
    layers=(16, 256), seconds: float = 0.5, side: int = 8, device=None
) -> dict[str, Any]:
    """{"kernels": each chain's kernel count, "seconds": each chain's time, "kernel_s": the
    time one more kernel adds (where the chains do not tell, the longer's time per kernel)}:
    chains of `side` x `side` layers on `device` (JAX's default: None)."""
    kernels, times = [], []
    for n in layers:
        compiled, args = _chain(n, side, device)
        kernels.append(opclass.classify(compiled.as_text()).kernels)
        times.append(_seconds(compiled, args, seconds))
    (k0, t0), (k1, t1) = (kernels[0], times[0]), (kernels[-1], times[-1])
    each = (t1 - t0) / (k1 - k0) if t1 > t0 and k1 > k0 else t1 / max(k1, 1)
    return {"kernels": kernels, "seconds": times, "kernel_s": each}


def measure_dispatch(seconds: float = 0.5, device=None, wait_each: bool = False) -> float:
    """Seconds one tiny program (v + 1 on 16 float32, its result the next call's argument)
    costs the host, dispatched without waiting as a trainer dispatches (`wait_each`: with a
    wait after each call); the best of 3 repeats."""
    import jax
    import jax.numpy as jnp

    tiny = jax.jit(lambda v: v + 1)
    held = [jax.device_put(jnp.ones(16, jnp.float32), device)]

    def call():
        held[0] = tiny(held[0])
        return held[0]

    return timer.measure(
        call, seconds, repeats=3, min_calls=2, window=0 if wait_each else None
    ).best


def kernel_report(m: dict[str, Any]) -> str:
    chains = ", ".join(f"{k} kernels {t * 1e6:.1f} us" for k, t in zip(m["kernels"], m["seconds"]))
    return (
        f"a kernel's fixed time (chains of tiny kernels: {chains})\n"
        f"  c.kernel_s = {m['kernel_s']:.3g}"
    )


def _collective_program(kind: str, n: int, batch: int, side: int, channels: int, layers: int):
    """Layers over n devices: "gather" / "copy" (the gathered input made locally), "psum" /
    "local" (no sum); (compiled, args, payload bytes a device a collective)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((n,), ("t",), devices=jax.devices()[:n])
    part = channels // n

    def conv(x, w):
        return jax.lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    def body(x, w):
        for _ in range(layers):
            if kind == "gather":
                x = jnp.tanh(conv(jax.lax.all_gather(x, "t", axis=3, tiled=True), w))
            elif kind == "copy":
                x = jnp.tanh(conv(jnp.concatenate([x * (1.0 + i) for i in range(n)], 3), w))
            elif kind == "psum":
                x = jnp.tanh(jax.lax.psum(conv(x, w), "t"))[..., :part]
            else:
                x = jnp.tanh(conv(x, w) * 2.0)[..., :part]
        return x

    shape = (3, 3, channels, part) if kind in ("gather", "copy") else (3, 3, part, channels)
    spec = P(None, None, None, "t")
    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, P()), out_specs=spec))
    x = jax.device_put(
        jnp.full((batch, side, side, channels), 0.01, jnp.float32), NamedSharding(mesh, spec)
    )
    w = jnp.full(shape, 0.001, jnp.float32)
    return fn.lower(x, w).compile(), (x, w), batch * side * side * channels * 4


def _cpu_seconds(compiled, args, seconds: float) -> float:
    """Process CPU seconds per call (all threads), over at least `seconds` of calls."""
    return timer.measure(lambda: compiled(*args), seconds, min_calls=3).cpu_s


def measure_collective_cpu(
    devices: int = 8,
    batch: int = 64,
    side: int = 8,
    channels: int = 64,
    layers: int = 8,
    seconds: float = 2.0,
) -> dict[str, Any]:
    """{"extra": {kind: CPU seconds a collective beyond its local stand-in}, "payload": bytes
    a device a collective, "devices": n, "rate": payload bytes per CPU-second, both kinds}."""
    import jax

    n = min(devices, jax.device_count())
    extra, payload = {}, 0
    for kind, local in (("gather", "copy"), ("psum", "local")):
        times = {}
        for k in (kind, local):
            compiled, args, payload = _collective_program(k, n, batch, side, channels, layers)
            times[k] = _cpu_seconds(compiled, args, seconds)
        extra[kind] = (times[kind] - times[local]) / layers
    spent = sum(extra.values())
    rate = len(extra) * payload * n / spent if spent > 0 else 0.0
    return {"extra": extra, "payload": payload, "devices": n, "rate": rate}


def collective_cpu_report(m: dict[str, Any]) -> str:
    each = ", ".join(f"{k} {v * 1e3:.2f} CPU-ms" for k, v in m["extra"].items())
    return (
        f"collectives inside a step on shared cores ({m['devices']} devices, "
        f"{m['payload'] / 1e6:.2f} MB a device each: {each} beyond local work)\n"
        f"  c.collective_cpu_rate = {m['rate']:.3g}"
    )


def measure_forward(run: dict[str, Any], seconds: float = 1.0) -> dict[str, Any]:
    """{"ops": the op classes of one call, "seconds": its time}: the model of calibration run
    `run` forward in training mode on one device at the run's batch."""
    import jax
    import jax.numpy as jnp

    from jaxpar import models
    from jaxpar.predict.workload import input_spec, run_config

    config = run_config(run)
    image_shape, classes = input_spec(config)
    model = models.build(config.model, image_shape, classes)
    variables = model.init(jax.random.key(0))
    x = jnp.zeros((run["batch_size"], *image_shape), jnp.float32)
    fn = jax.jit(lambda p, s, x: model.apply(p, s, x, train=True))
    compiled = fn.lower(variables["params"], variables["batch_stats"], x).compile()
    args = (variables["params"], variables["batch_stats"], x)
    return {
        "ops": opclass.classify(compiled.as_text()),
        "seconds": _seconds(compiled, args, seconds),
        "dtype": run.get("dtype", "float32"),
        "model": run["model"],
    }


def forward_report(profile, forward: dict[str, Any]) -> str:
    """The forward pass's time against its price on `profile` (fitted), and the speedup."""
    price = profile.device_time(forward["ops"], forward["dtype"], forward["model"])
    speedup = price / forward["seconds"]
    return (
        f"forward pass ({forward['model']}, one device): {forward['seconds'] * 1e3:.2f} ms, "
        f"priced at the fitted rates {price * 1e3:.2f} ms\n"
        f"  c.forward_speedup = {speedup:.2f}"
    )


def _dispatches(stages: int) -> int:
    """Programs and transfers the runner dispatches per micro-batch of a K-stage GPipe or 1F1B
    pipeline: a forward per stage but the last, a backward per stage, two transfers per
    boundary (model._pipeline_times counts the same)."""
    return (2 * stages - 1) + 2 * (stages - 1)


LAYOUTS = ((1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (4, 2))  # (devices per stage, stages)
HOST_COSTS = (
    "stage_overhead_s",
    "stage_device_overhead_s",
    "microbatch_overhead_s",
    "program_overhead_s",
    "program_device_overhead_s",
)


def host_features(k: int, m: int, d: int = 1) -> list[float]:
    """What each of HOST_COSTS is paid for in one step of a K-stage pipeline over M
    micro-batches on D devices per stage: stages, stages x further devices, micro-batches,
    dispatches, dispatches x further devices."""
    p = m * _dispatches(k)
    return [k, k * (d - 1), m, p, p * (d - 1)]


def fit_host(points: list[tuple], step_s: float) -> dict[str, float]:
    """HOST_COSTS that fit (K, M[, D], host seconds per step) best in least squares, beside a
    fixed `step_s` per step; none below 0 (a cost the points cannot tell apart is 0)."""
    import numpy as np

    features = np.array([host_features(*p[:-1]) for p in points], float)
    target = np.array([p[-1] - step_s for p in points])
    keep = [i for i in range(len(HOST_COSTS)) if features[:, i].any()]
    while True:  # drop a negative cost and solve again (non-negative least squares)
        coef, *_ = np.linalg.lstsq(features[:, keep], target, rcond=None)
        if (coef >= 0).all():
            break
        keep.pop(int(np.argmin(coef)))
    out = dict.fromkeys(HOST_COSTS, 0.0)
    out.update({HOST_COSTS[i]: float(c) for i, c in zip(keep, coef)})
    return out


def host_seconds(costs, k: int, m: int, d: int, step_s: float) -> float:
    """The runner's host time per step priced by `costs` (a dict of HOST_COSTS or a profile)."""
    get = costs.get if isinstance(costs, dict) else lambda n: getattr(costs, n)
    return step_s + sum(get(n) * f for n, f in zip(HOST_COSTS, host_features(k, m, d)))


def measure_host(
    run: dict[str, Any],
    layouts=LAYOUTS,
    microbatches=(1, 2, 4, 8),
    steps: int = 10,
    repeats: int = 3,
    stream=sys.stderr,
) -> list[tuple[int, int, int, float]]:
    """[(K, M, D, seconds)]: the dispatching thread's CPU time per training step of the run's
    model at a quarter of its width as a K-stage GPipe pipeline over M micro-batches, each
    stage's batch split over D devices (the mesh (D, K, 1)), for each (D, K) of `layouts`, the
    least of `repeats` runs of `steps` steps. A line per pipeline measured goes to `stream`
    (count, figure, ETA): the whole takes minutes."""
    import jax

    from jaxpar import trainer, units
    from jaxpar.predict.workload import run_config

    total, started = len(layouts) * len(microbatches), time.perf_counter()

    most = max(d * k for d, k in layouts)
    if len(jax.devices()) < most:
        raise ValueError(
            f"measuring the pipeline's host time needs {most} devices, jax has {len(jax.devices())}"
        )
    out = []
    for d, k in layouts:
        for m in microbatches:
            config = run_config({**run, "width": run.get("width", 1.0) / 4})
            config.mesh_shape = (d, k, 1)
            config.pipeline.schedule, config.pipeline.num_microbatches = "gpipe", m
            setup = trainer.setup(config, jax.devices()[: d * k])
            state = setup.strategy.init_state(jax.random.key(0))
            batch = setup.strategy.put_batch(trainer.local_train_batch(setup, 0))

            step = timer.carrying(setup.strategy.train_step, state, batch)
            # the first call compiles; the dispatching thread's CPU time, the least repeat's
            timed = timer.measure(step, 0.0, calls=steps, repeats=repeats, window=None)
            best = timed.thread_s
            out.append((k, m, d, best))
            if stream is not None:
                eta = (time.perf_counter() - started) / len(out) * (total - len(out))
                print(
                    f"  host time {len(out)}/{total}: K={k} M={m} D={d} {best * 1e3:.2f} ms "
                    f"a step, ETA {units.clock(eta)}",
                    file=stream,
                    flush=True,
                )
    return out


def host_report(points: list[tuple], step_s: float) -> str:
    """The measured host times, the fitted costs and how well they carry."""
    costs = fit_host(points, step_s)
    lines = [
        (
            "pipeline runner's host time per step (dispatching thread's CPU time; GPipe, "
            "the run's model at a quarter of its width, D devices per stage):"
        )
    ]
    for *layout, t in points:
        k, m, d = (*layout, 1)[:3]
        fitted = host_seconds(costs, k, m, d, step_s)
        lines.append(
            f"  K={k} M={m} D={d}: {t * 1e3:.2f} ms (fitted {fitted * 1e3:.2f}, "
            f"{100 * (fitted / t - 1):+.0f}%)"
        )
    lines.append("  " + "; ".join(f"c.{n} = {v:.3g}" for n, v in costs.items()))
    return "\n".join(lines)
