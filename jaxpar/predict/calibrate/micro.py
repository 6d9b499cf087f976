"""Microbenchmarks of the local device that a profile of it prices with, each a property of the
device measured like a link's bandwidth, not fitted to any partitioning
(`python -m jaxpar.predict --calibrate ... --pool` runs them all, with cpulinks.py's and
pipelinehost.py's).

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
difference of their kernel counts, so the call's own dispatch drops out (`python -m
jaxpar.predict --calibrate SOURCE --profile BASE --pool` prints it; the figure a profile uses
and how it varies between runs are stated in its file, configs/hardware/cpu_2core_models.py).
A profile that fits kernel_s to whole steps instead puts memory-bound work there
(configs/hardware/cpu_2core.py).

A program's dispatch (`measure_dispatch`): the host's time per call of a tiny program,
dispatched without waiting as a trainer dispatches (a profile's program_overhead_s).

The forward pass (`measure_forward`). A pipeline runs each chunk's forward as a program of its
own. On XLA:CPU a training step's backward carries memory-bound work its FLOPs do not show
(transposed operands, reversed kernels, the max-pool gradient's index tensors), so rates fitted
to training steps overprice a forward-only program. Measured: the calibration run's model
forward (training-mode BatchNorm, as a pipeline runs it) on one device; the profile's
forward_speedup is its price at the fitted rates over its time.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics

import jax
import jax.numpy as jnp

from jaxpar import models
from jaxpar.predict.calibrate import timer
from jaxpar.predict.kernels import opclass
from jaxpar.predict.profiles import solve
from jaxpar.predict.profiles.calibration_runs import run_config
from jaxpar.predict.profiles.records import CalibrationRun
from jaxpar.predict.programs.workload import input_spec
from jaxpar.predict.step import pricing

log = logging.getLogger(__name__)

WIDTHS = (2, 4, 8, 16, 32, 64)


def _layer(batch: int, side: int, channels: int, width: int):

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
    """(narrow_width, FLOP/s): the width (0 to 64 in quarters: solve.grid) that prices every
    program's matrix kernels at n / (n + width) of one rate with the least squared log error
    over (op classes, seconds); a width at the grid's end is said in a warning."""

    def logs(d0: float) -> list[float]:
        work = [sum(m.flops * (m.narrow + d0) / m.narrow for m in ops.matmuls) for ops, _ in points]
        return [math.log(w / t) for w, (_, t) in zip(work, points)]

    def err(d0: float) -> float:
        x = logs(d0)
        rate = statistics.fmean(x)
        return sum((v - rate) ** 2 for v in x)

    widths = [step / 4 for step in range(64 * 4 + 1)]
    found = solve.grid("narrow_width", widths, err, tol=1e-12)
    d0 = found.values["narrow_width"]
    if found.at_bound:
        log.warning("narrow_width fitted at its bound (%g of 0 to %g)", d0, widths[-1])
    return d0, math.exp(statistics.fmean(logs(d0)))


@dataclasses.dataclass(frozen=True)
class NarrowKernels:
    """A 3x3 convolution's gradient timed by its output features, and the fit of them."""

    rates: dict[int, float]  # FLOP/s by output features
    narrow_width: float  # d0: a kernel of n features runs at n / (n + d0) of flops_per_s
    flops_per_s: float


def measure_narrow(
    widths=WIDTHS, batch: int = 64, side: int = 16, channels: int = 32, seconds: float = 0.5
) -> NarrowKernels:
    """The layer's rate at each of `widths` output features, and the fitted narrow_width."""
    points, rates = [], {}
    for width in widths:
        compiled, args = _layer(batch, side, channels, width)
        ops = opclass.classify(compiled.as_text())
        t = _seconds(compiled, args, seconds)
        points.append((ops, t))
        rates[width] = ops.flops / t
    d0, rate = fit(points)
    return NarrowKernels(rates, d0, rate)


def narrow_report(m: NarrowKernels) -> str:
    rates = ", ".join(f"{n}: {r / 1e9:.1f}" for n, r in m.rates.items())
    return (
        f"narrow matrix kernels (a 3x3 convolution's gradient, by output features; "
        f"GFLOP/s): {rates}\n  fitted: n / (n + {m.narrow_width:g}) of "
        f"{m.flops_per_s / 1e9:.1f} GFLOP/s\n  c.narrow_width = {m.narrow_width:g}"
    )


def _chain(layers: int, side: int = 8, device=None):
    """A program of `layers` tiny matrix kernels, each followed by an elementwise one (on
    `device`, or JAX's default)."""

    def chain(x, w):
        for _ in range(layers):
            x = jnp.tanh(x @ w)
        return x

    x = jnp.full((side, side), 0.01, jnp.float32)
    w = jnp.eye(side, dtype=jnp.float32) * 0.5
    if device is not None:
        x, w = jax.device_put((x, w), device)
    return jax.jit(chain).lower(x, w).compile(), (x, w)


@dataclasses.dataclass(frozen=True)
class KernelTime:
    """Chains of tiny kernels timed, and what one more kernel adds."""

    kernels: list[int]  # each chain's kernel count
    seconds: list[float]  # each chain's time
    kernel_s: float  # where the chains do not tell, the longer's time per kernel


def measure_kernel(
    layers=(16, 256), seconds: float = 0.5, side: int = 8, device=None
) -> KernelTime:
    """Chains of `side` x `side` layers, `layers` long, on `device` (JAX's default: None)."""
    kernels, times = [], []
    for n in layers:
        compiled, args = _chain(n, side, device)
        kernels.append(opclass.classify(compiled.as_text()).kernels)
        times.append(_seconds(compiled, args, seconds))
    (k0, t0), (k1, t1) = (kernels[0], times[0]), (kernels[-1], times[-1])
    each = (t1 - t0) / (k1 - k0) if t1 > t0 and k1 > k0 else t1 / max(k1, 1)
    return KernelTime(kernels, times, each)


def measure_dispatch(seconds: float = 0.5, device=None, wait_each: bool = False) -> float:
    """Seconds one tiny program (v + 1 on 16 float32, its result the next call's argument)
    costs the host, dispatched without waiting as a trainer dispatches (`wait_each`: with a
    wait after each call); the best of 3 repeats."""

    tiny = jax.jit(lambda v: v + 1)
    held = [jax.device_put(jnp.ones(16, jnp.float32), device)]

    def call():
        held[0] = tiny(held[0])
        return held[0]

    return timer.measure(
        call, seconds, repeats=3, min_calls=2, window=0 if wait_each else None
    ).best


def kernel_report(m: KernelTime) -> str:
    chains = ", ".join(f"{k} kernels {t * 1e6:.1f} us" for k, t in zip(m.kernels, m.seconds))
    return (
        f"a kernel's fixed time (chains of tiny kernels: {chains})\n  c.kernel_s = {m.kernel_s:.3g}"
    )


@dataclasses.dataclass(frozen=True)
class ForwardPass:
    """A calibration run's model forward, timed on one device."""

    ops: opclass.OpClasses  # one call's op classes
    seconds: float  # its time
    dtype: str
    model: str


def measure_forward(run: CalibrationRun, seconds: float = 1.0) -> ForwardPass:
    """The model of calibration run `run` forward in training mode on one device at the run's
    batch."""

    config = run_config(run)
    image_shape, classes = input_spec(config)
    model = models.build(config.model, image_shape, classes)
    variables = model.init(jax.random.key(0))
    x = jnp.zeros((run.batch_size, *image_shape), jnp.float32)
    fn = jax.jit(lambda p, s, x: model.apply(p, s, x, train=True))
    compiled = fn.lower(variables["params"], variables["batch_stats"], x).compile()
    args = (variables["params"], variables["batch_stats"], x)
    ops = opclass.classify(compiled.as_text())
    return ForwardPass(ops, _seconds(compiled, args, seconds), run.dtype, run.model)


def forward_report(profile, forward: ForwardPass) -> str:
    """The forward pass's time against its price on `profile` (fitted), and the speedup."""
    price = pricing.device_time(profile, forward.ops, forward.dtype, forward.model)
    speedup = price / forward.seconds
    return (
        f"forward pass ({forward.model}, one device): {forward.seconds * 1e3:.2f} ms, "
        f"priced at the fitted rates {price * 1e3:.2f} ms\n"
        f"  c.forward_speedup = {speedup:.2f}"
    )
