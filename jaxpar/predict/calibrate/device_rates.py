"""--calibrate-here's microbenchmarks of this machine's first device (here.py runs them):
matmul FLOP/s, memory bandwidth, a program's dispatch and a small kernel's fixed time (micro.py
measures those two), memory per device; on a GPU the first layer's convolutions
(thin_efficiency) and narrow layers' by their features (tile_width), and convolution shapes
timed into a kernel table (`time_kernels`: DeepBench's and the rows' own, `own_shapes`).
Every figure is timed by timer.measure."""

from __future__ import annotations

import dataclasses
import logging
import os

import jax
import jax.numpy as jnp

from jaxpar.predict.calibrate import micro, timer
from jaxpar.predict.calibrate.model_runs import parse_row
from jaxpar.predict.calibrate.records import Microbenchmarks
from jaxpar.predict.kernels import kernel_table, model_layers, opclass
from jaxpar.predict.kernels.kernel_table import ConvRow
from jaxpar.predict.profiles import solve

log = logging.getLogger(__name__)

# the rows' own convolution shapes timed beside DeepBench's (own_shapes), at most
MODEL_SHAPES = 24


def _per_call(fn, args: tuple, seconds: float, sync_each: bool = False) -> float:
    """Seconds per call of fn(*args) on the device (timer.measure): 3 repeats of about
    seconds / 3 each (calls dispatched without waiting unless `sync_each`, the device
    synchronised at the end), the best of them. A one-argument fn is chained, its result the
    next call's argument (a donated buffer is written in place)."""
    held = [args]

    def call():
        out = fn(*held[0])
        if len(args) == 1:
            held[0] = (out,)
        return out

    window = 0 if sync_each else None
    return timer.measure(call, seconds, repeats=3, min_calls=2, window=window).best


def _thin_rate(device, dtype: str, seconds: float) -> float:
    """FLOP/s of an image's first layer as a training step runs it: a 7x7 stride-2
    convolution of 3 channels to 64 and its weight gradient (the image gets none)."""
    gpu = device.platform == "gpu"
    x = jax.device_put(
        jnp.ones((64 if gpu else 4, 224 if gpu else 64, 224 if gpu else 64, 3), dtype), device
    )
    w = jax.device_put(jnp.ones((7, 7, 3, 64), dtype) * 0.01, device)

    def loss(w, x):
        y = jax.lax.conv_general_dilated(
            x, w, (2, 2), [(3, 3), (3, 3)], dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        return jnp.sum(y.astype(jnp.float32))

    grad = jax.jit(jax.grad(loss))
    flops = 2 * 2 * x.shape[0] * (x.shape[1] // 2) * (x.shape[2] // 2) * 64 * 7 * 7 * 3
    return flops / _per_call(grad, (w, x), seconds)


NARROW_FEATURES = (8, 16, 32, 64, 128, 256)  # output features of the narrow convolutions timed


def _narrow_conv_rates(device, dtype: str, seconds: float) -> dict[int, float]:
    """FLOP/s of one 3x3 convolution layer's training kernels (its forward, input gradient and
    filter gradient, one program) over 256 input features by its output features n (batch 64,
    32x32; DenseNet's layers have 12): a GPU's tensor-core tiles are some width T in each GEMM
    dimension, so a layer with n < T fills n / T of each (hardware.Compute.tile_width)."""
    x = jax.device_put(jnp.ones((64, 32, 32, 256), dtype), device)
    rates = {}
    for n in NARROW_FEATURES:
        w = jax.device_put(jnp.ones((3, 3, 256, n), dtype) * 0.01, device)
        dy = jax.device_put(jnp.ones((64, 32, 32, n), dtype), device)

        def step(x, w, dy):
            conv = lambda x, w: jax.lax.conv_general_dilated(
                x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
            )
            y, back = jax.vjp(conv, x, w)
            return y, *back(dy)

        flops = 3 * 2 * 64 * 32 * 32 * 256 * n * 9
        rates[n] = flops / _per_call(jax.jit(step), (x, w, dy), seconds)
    return rates


def fit_tile_width(rates: dict[int, float]) -> float:
    """The tile width T (a power of two, 8 to 1024) whose rate(n) = r0 x min(1, n / T) fits the
    measured rates best (least squares of the log error, r0 the best for each T); a width at
    either end is said in a warning."""
    import numpy as np

    n = np.array(sorted(rates), dtype=float)
    r = np.log([rates[int(k)] for k in n])

    def cost(t: float) -> float:
        e = r - np.log(np.minimum(1.0, n / t))
        return float(np.sum((e - e.mean()) ** 2))

    found = solve.grid("tile_width", [2.0**k for k in range(3, 11)], cost)
    width = float(found.values["tile_width"])
    if found.at_bound:
        log.warning("tile_width fitted at its bound (%g of 8 to 1024)", width)
    return width


def own_shapes(rows: list[str], dtype: str, limit: int = MODEL_SHAPES) -> list[ConvRow]:
    """The convolution shapes of the rows computing in `dtype` (model_layers.model_rows), each
    once, the most frequent first, at most `limit` of them; none of fewer than THIN input
    channels (a first layer: priced apart) or already in DeepBench's rows."""
    seen = {r.shape for r in kernel_table.load(kernel_table.SHIPPED)}
    counted: dict[ConvRow, int] = {}
    for spec in rows:
        run = parse_row(spec)
        if run.dtype != dtype:
            continue
        for row, n in model_layers.model_rows(run):
            if row.c >= opclass.THIN and row not in seen:
                counted[row] = counted.get(row, 0) + n
    return sorted(counted, key=lambda row: -counted[row])[:limit]


def time_kernels(rows: list[ConvRow], dtype: str, seconds: float) -> list[ConvRow]:
    """Each convolution shape of `rows` (kernel_table.py's table format) timed on the first
    device in `dtype`: its forward, its input gradient and its filter gradient, each a
    program of its own (jit), milliseconds per call (`_per_call`: best of 3 repeats)."""
    device = jax.devices()[0]
    out = []
    for row in rows:
        n, h, w, c, k, r, s = row.n, row.h, row.w, row.c, row.k, row.r, row.s
        strides = (row.stride_h, row.stride_w)
        pad = [(row.pad_h,) * 2, (row.pad_w,) * 2]
        x = jax.device_put(jnp.ones((n, h, w, c), dtype), device)
        f = jax.device_put(jnp.ones((r, s, c, k), dtype) * 0.01, device)

        def conv(x, f, strides=strides, pad=pad):
            return jax.lax.conv_general_dilated(
                x, f, strides, pad, dimension_numbers=("NHWC", "HWIO", "NHWC")
            )

        y = jax.device_put(jnp.ones(jax.eval_shape(conv, x, f).shape, dtype), device)
        forward = jax.jit(conv)
        input_grad = jax.jit(lambda x, f, y, conv=conv: jax.vjp(lambda v: conv(v, f), x)[1](y)[0])
        filter_grad = jax.jit(lambda x, f, y, conv=conv: jax.vjp(lambda v: conv(x, v), f)[1](y)[0])
        out.append(
            dataclasses.replace(
                row,
                forward_ms=1e3 * _per_call(forward, (x, f), seconds),
                input_grad_ms=1e3 * _per_call(input_grad, (x, f, y), seconds),
                filter_grad_ms=1e3 * _per_call(filter_grad, (x, f, y), seconds),
            )
        )
    return out


def microbenchmarks(seconds: float = 0.5) -> Microbenchmarks:
    """This machine's first device: float32 (and on a GPU bfloat16) matmul FLOP/s at a few
    sizes, memory bandwidth (x * 2 + 1: bytes read + written per second), one small kernel's
    time inside a program (`kernel_s`), one tiny program's host dispatch without waiting
    (`launch_s`) and with a wait after each (`sync_call_s`), and the memory per device."""
    gpu = (device := jax.devices()[0]).platform == "gpu"
    put = lambda a: jax.device_put(a, device)
    matmul = jax.jit(lambda a, b: a @ b)
    matmuls, thin, narrow = {}, {}, {}
    for dtype in ("float32", "bfloat16") if gpu else ("float32",):
        rates = {}
        for n in (1024, 4096, 8192) if gpu else (256, 512):
            a = put(jnp.ones((n, n), dtype))
            rates[n] = 2 * n**3 / _per_call(matmul, (a, a), seconds)
        matmuls[dtype] = rates
        thin[dtype] = _thin_rate(device, dtype, seconds)
        if gpu:
            narrow[dtype] = _narrow_conv_rates(device, dtype, seconds)
    x = put(jnp.ones((1 << 28 if gpu else 1 << 24), jnp.float32))  # 1 GiB / 64 MiB
    elementwise = jax.jit(lambda v: v * 2 + 1, donate_argnums=0)  # in place: no page faults
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / len(jax.local_devices())
    limit = (device.memory_stats() or {}).get("bytes_limit")  # a GPU's; a CPU shares the RAM
    peaks = {dtype: rates[max(rates)] for dtype, rates in matmuls.items()}
    return Microbenchmarks(
        platform=device.platform,
        device_kind=device.device_kind,
        jax=jax.__version__,
        seconds=seconds,
        # simulated CPU devices: all of them
        num_devices=jax.local_device_count() if gpu else len(jax.devices()),
        matmul=matmuls,
        flops_per_s=peaks,
        thin_conv=thin,
        narrow_conv=narrow,
        matmul_flops_per_s=peaks["float32"],
        memory_bandwidth_array_bytes=x.nbytes,
        memory_bandwidth=2 * x.nbytes / _per_call(elementwise, (x,), seconds),
        launch_s=micro.measure_dispatch(seconds, device),
        sync_call_s=micro.measure_dispatch(seconds, device, wait_each=True),
        # one small kernel's time inside a program: chains of 32x32 matmuls (kernels XLA does
        # not fuse away), the longer's extra time over its extra kernels
        kernel_s=micro.measure_kernel(seconds=seconds, side=32, device=device).kernel_s,
        peak_memory_bytes=float(limit or ram),
    )
