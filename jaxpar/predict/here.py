"""`python -m jaxpar.predict --calibrate-here OUT.py`: a hardware profile of this machine
(configs/hardware/*.py format) from microbenchmarks of its first device (matmul FLOP/s, memory
bandwidth, a small kernel's and a program dispatch's cost, memory; on a GPU the first layer's
convolutions and narrow layers' by their features: thin_efficiency, tile_width) and jaxpar's one-device
training step timed on a few models (`--here-rows`): its `calibration_runs`, fitted on loading.
On a GPU also 24 convolution shapes of DeepBench's and up to 24 of the rows' own models timed
into a kernel table (its matrix kernels' costs), and
two steps of each row traced with XLA's command buffers off (trace_rows), whose memory-bound
kernels give the profile's memory_bandwidth, kernel_s and memory_kernel_costs (traced_costs,
jaxpar/predict/traces.py): what the H100 profile's were fitted from by hand.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import pprint
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxpar import configfile, models, oneline
from jaxpar.errors import ConfigError
from jaxpar.predict import calibrate, fitting, kernels, micro, opclass, timer, traces
from jaxpar.predict.workload import run_config

CPU_ROWS = ("vgg19:0.25:32:float32:32", "resnet20:1.0:32:float32:32")
GPU_ROWS = (
    "vgg19:1.0:32:float32:128",
    "vgg19:1.0:32:bfloat16:512",
    "resnet50:1.0:224:bfloat16:128",
    "resnet20:1.0:32:float32:128",
)
DEFAULT_FIT = ("compute_efficiency", "kernel_s")
# on a GPU, once its matrix kernels' costs come from its own kernel table (kernels.py): the
# per-kernel time of every kernel, fitted to the model rows
KERNEL_TABLE_FIT = ("kernel_s",)
# and once the rows' own kernel traces have given the memory-bound kernels' costs and the
# per-kernel time (traced_costs): what a matrix kernel costs inside a step beyond its price
TRACED_FIT = ("matmul_kernel_s",)
# the share of a traced step's kernel time that must name an instruction of its program for
# its costs to be fitted (XLA's command buffers hide the names of what they hold)
NAMED_SHARE = 0.9
# the rows' own convolution shapes timed beside DeepBench's (own_shapes), at most
MODEL_SHAPES = 24


def add_arguments(parser) -> None:
    """--calibrate-here OUT.py, --here-rows, --here-seconds, --here-fit."""
    say = "with --calibrate-here: "
    parser.add_argument(
        "--calibrate-here",
        metavar="OUT.py",
        help="time this machine's device "
        "and its one-device training step; write a hardware profile to OUT.py",
    )
    parser.add_argument(
        "--here-rows",
        help=say + "MODEL:WIDTH:IMAGE:DTYPE:BATCH,... to time "
        "(default: two small rows on a CPU, four full-width ones on a GPU)",
    )
    parser.add_argument("--here-seconds", type=float, default=2.0, help=say + "seconds per row")
    parser.add_argument(
        "--here-fit",
        help=say + "costs to fit (fitting.FITTABLE; default "
        "compute_efficiency,kernel_s, or compute_efficiency for one row)",
    )
    parser.add_argument(
        "--here-devices",
        type=int,
        help=say + "the profile's node holds this many "
        "of these devices (default: the ones here; links stay placeholders)",
    )


def _plan(args) -> tuple[list[str], tuple[str, ...]]:
    """The rows to time and the costs to fit, checked before anything is timed."""
    gpu = jax.devices()[0].platform == "gpu"
    rows = [r for r in (args.here_rows or "").split(",") if r] or list(
        GPU_ROWS if gpu else CPU_ROWS
    )
    given = (getattr(args, "here_fit", None) or "").split(",")
    names = tuple(n.strip() for n in given if n.strip()) or DEFAULT_FIT[: len(rows)]
    if bad := [n for n in names if n not in fitting.FITTABLE]:
        raise ConfigError(f"--here-fit: no cost {bad[0]!r}; one of {', '.join(fitting.FITTABLE)}")
    if len(rows) < len(names):
        raise ConfigError(
            f"fitting {len(names)} costs needs {len(names)} rows, not "
            f"{len(rows)}: add --here-rows or name fewer in --here-fit"
        )
    if not args.here_seconds > 0:
        raise ConfigError("--here-seconds must be positive")
    if getattr(args, "here_devices", None) is not None and args.here_devices < 1:
        raise ConfigError("--here-devices must be at least 1")
    if gpu and "compute_efficiency" in names and "conv3x3_efficiency" not in names:
        print(
            "note: on a GPU the profile's matrix kernels are priced from the kernels timed "
            "here; fitting compute_efficiency alone to the rows drops their 3x3 rate (the "
            "default fits kernel_s: leave out --here-fit)",
            file=sys.stderr,
        )
    return [parse_row(r)["name"] for r in rows], names


def run(args) -> int:
    """--calibrate-here: measure, write the profile, print the report; 2 on a refusal."""
    try:
        rows, names = _plan(args)
        t0 = time.perf_counter()
        micro = microbenchmarks(min(0.5, args.here_seconds))
        t1 = time.perf_counter()
        runs = model_runs(rows, args.here_seconds)
        table = None
        if micro["platform"] == "gpu":  # the matrix kernels' costs from kernels of its own
            dtype = _runs_dtype(runs)
            shapes = kernels.vision_rows(kernels.load(kernels.SHIPPED)) + own_shapes(rows, dtype)
            table = (dtype, time_kernels(shapes, dtype, min(0.2, args.here_seconds)))
            micro["traced"] = trace_and_fit(rows)
            if not getattr(args, "here_fit", None):  # what the table and traces do not hold
                names = (
                    TRACED_FIT if micro["traced"].get("memory_kernel_costs") else KERNEL_TABLE_FIT
                )
        t2 = time.perf_counter()
        if getattr(args, "here_devices", None):
            micro["devices_here"], micro["num_devices"] = micro["num_devices"], args.here_devices
        text = write_profile(args.calibrate_here, micro, runs, names, table)
    except ValueError as e:  # ConfigError and friends
        oneline.print_error(oneline.first_line(e))
        return 2
    print(text)
    print(
        f"\ntook {time.perf_counter() - t0:.1f} s: microbenchmarks {t1 - t0:.1f} s, model "
        f"runs {t2 - t1:.1f} s, links, fit and report {time.perf_counter() - t2:.1f} s"
    )
    return 0


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
    dimension, so a layer with n < T fills n / T of each (hardware.Profile.tile_width)."""
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
    measured rates best (least squares of the log error, r0 the best for each T)."""
    import numpy as np

    n = np.array(sorted(rates), dtype=float)
    r = np.log([rates[int(k)] for k in n])

    def cost(t: float) -> float:
        e = r - np.log(np.minimum(1.0, n / t))
        return float(np.sum((e - e.mean()) ** 2))

    return float(min((2.0**k for k in range(3, 11)), key=cost))


def own_shapes(rows: list[str], dtype: str, limit: int = MODEL_SHAPES) -> list[dict[str, float]]:
    """The convolution shapes of the rows computing in `dtype` (kernels.model_rows), each
    once, the most frequent first, at most `limit` of them; none of fewer than THIN input
    channels (a first layer: priced apart) or already in DeepBench's rows."""
    seen = {tuple(r[c] for c in kernels._COLUMNS[:11]) for r in kernels.load(kernels.SHIPPED)}
    counted: dict[tuple, int] = {}
    for spec in rows:
        run = parse_row(spec)
        if run["dtype"] != dtype:
            continue
        for row, n in kernels.model_rows(run):
            key = tuple(row[c] for c in kernels._COLUMNS[:11])
            if row["C"] >= opclass.THIN and key not in seen:
                counted[key] = counted.get(key, 0) + n
    ranked = sorted(counted, key=lambda key: -counted[key])[:limit]
    return [dict(zip(kernels._COLUMNS[:11], key)) for key in ranked]


def time_kernels(rows: list[dict[str, float]], dtype: str, seconds: float) -> list[dict]:
    """Each convolution shape of `rows` (kernels.py's table format) timed on the first
    device in `dtype`: its forward, its input gradient and its filter gradient, each a
    program of its own (jit), milliseconds per call (`_per_call`: best of 3 repeats)."""
    device = jax.devices()[0]
    out = []
    for row in rows:
        n, h, w, c, k, r, s = (int(row[x]) for x in ("N", "H", "W", "C", "K", "R", "S"))
        strides = (int(row["stride_h"]), int(row["stride_w"]))
        pad = [(int(row["pad_h"]),) * 2, (int(row["pad_w"]),) * 2]
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
            {
                **row,
                "forward_ms": 1e3 * _per_call(forward, (x, f), seconds),
                "input_grad_ms": 1e3 * _per_call(input_grad, (x, f, y), seconds),
                "filter_grad_ms": 1e3 * _per_call(filter_grad, (x, f, y), seconds),
            }
        )
    return out


def microbenchmarks(seconds: float = 0.5) -> dict[str, Any]:
    """This machine's first device: float32 (and on a GPU bfloat16) matmul FLOP/s at a few
    sizes, memory bandwidth (x * 2 + 1: bytes read + written per second), one small kernel's
    time inside a program (`kernel_s`), one tiny program's host dispatch without waiting
    (`launch_s`) and with a wait after each (`sync_call_s`), and the memory per device."""
    gpu = (device := jax.devices()[0]).platform == "gpu"
    put = lambda a: jax.device_put(a, device)
    out: dict[str, Any] = {
        "platform": device.platform,
        "device_kind": device.device_kind,
        "jax": jax.__version__,
        "seconds": seconds,  # simulated CPU devices:
        "num_devices": jax.local_device_count() if gpu else len(jax.devices()),
    }
    matmul = jax.jit(lambda a, b: a @ b)
    for dtype in ("float32", "bfloat16") if gpu else ("float32",):
        rates = {}
        for n in (1024, 4096, 8192) if gpu else (256, 512):
            a = put(jnp.ones((n, n), dtype))
            rates[n] = 2 * n**3 / _per_call(matmul, (a, a), seconds)
        out[f"matmul_{dtype}"] = rates
        out[f"{dtype}_flops_per_s"] = rates[max(rates)]
        out[f"thin_conv_{dtype}"] = _thin_rate(device, dtype, seconds)
        if gpu:
            out[f"narrow_conv_{dtype}"] = _narrow_conv_rates(device, dtype, seconds)
    out["matmul_flops_per_s"] = out["float32_flops_per_s"]
    x = put(jnp.ones((1 << 28 if gpu else 1 << 24), jnp.float32))  # 1 GiB / 64 MiB
    out["memory_bandwidth_array_bytes"] = x.nbytes
    elementwise = jax.jit(lambda v: v * 2 + 1, donate_argnums=0)  # in place: no page faults
    out["memory_bandwidth"] = 2 * x.nbytes / _per_call(elementwise, (x,), seconds)
    out["launch_s"] = micro.measure_dispatch(seconds, device)
    out["sync_call_s"] = micro.measure_dispatch(seconds, device, wait_each=True)
    # one small kernel's time inside a program: chains of 32x32 matmuls (kernels XLA does not
    # fuse away), the longer's extra time over its extra kernels
    out["kernel_s"] = micro.measure_kernel(seconds=seconds, side=32, device=device)["kernel_s"]
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / len(jax.local_devices())
    limit = (device.memory_stats() or {}).get("bytes_limit")  # a GPU's; a CPU shares the RAM
    out["peak_memory_bytes"] = float(limit or ram)
    return out


def parse_row(spec: str) -> dict[str, Any]:
    """A calibration run (without its rate) from MODEL:WIDTH:IMAGE:DTYPE:BATCH."""
    try:
        model, width, image, dtype, batch = spec.split(":")
        width, image, batch = float(width), int(image), int(batch)
    except ValueError:
        raise ConfigError(
            f"row {spec!r}: expected MODEL:WIDTH:IMAGE:DTYPE:BATCH, e.g. vgg19:0.25:32:float32:32"
        ) from None
    if model not in models.NAMES:
        raise ConfigError(f"row {spec!r}: no model {model!r}; one of {', '.join(models.NAMES)}")
    if dtype not in ("float32", "bfloat16") or min(width, image, batch) <= 0:
        raise ConfigError(f"row {spec!r}: dtype float32 or bfloat16; width, image, batch > 0")
    return {
        "name": spec,
        "model": model,
        "width": width,
        "batch_norm": True,
        "head": "auto",
        "image_shape": (image, image, 3),
        "num_classes": 10,
        "dtype": dtype,
        "batch_size": batch,
    }


def _images_per_sec(run: dict[str, Any], seconds: float) -> float:
    """jaxpar's one-device training step of `run` (trainer.setup on the first device, as
    benchmarks/single_device.py times it): compiled and warmed up, then timed for about
    `seconds`, dispatched without waiting and the device synchronised at the end."""
    from jaxpar import trainer

    s = trainer.setup(run_config(run), [jax.devices()[0]])
    state = s.strategy.init_state(jax.random.key(0))
    batch = s.strategy.put_batch(trainer.local_train_batch(s, 0))

    step = timer.carrying(s.strategy.train_step, state, batch)  # the state is donated
    timed = timer.measure(step, seconds, warmup=3, min_calls=3, window=None)
    return run["batch_size"] / timed.best


def model_runs(rows: list[str], seconds: float) -> list[dict[str, Any]]:
    """Each row (MODEL:WIDTH:IMAGE:DTYPE:BATCH) as a calibration run with its measured
    `images_per_sec` on this machine's first device."""
    return [{**r, "images_per_sec": _images_per_sec(r, seconds)} for r in map(parse_row, rows)]


def trace_row(spec: str, where: str) -> tuple[str, str]:
    """jaxpar's one-device training step of a row (MODEL:WIDTH:IMAGE:DTYPE:BATCH) on the first
    device, compiled with XLA's command buffers off (so that every kernel of a GPU's trace
    names its instruction; the rows' speed is timed as a user runs, with them on), warmed up,
    two steps traced under JAX's profiler into where/NAME, and the program traced written to
    where/NAME.hlo.txt: (trace folder, program file), what traces.joined reads."""
    from jaxpar import analysis, trainer

    run = parse_row(spec)
    s = trainer.setup(run_config(run), [jax.devices()[0]])
    (program,) = analysis.programs(s.strategy, run["batch_size"])
    step = program.lowered.compile(compiler_options={"xla_gpu_enable_command_buffer": ""})
    state = s.strategy.init_state(jax.random.key(0))
    batch = s.strategy.put_batch(trainer.local_train_batch(s, 0))
    for _ in range(3):
        state, _ = step(state, batch)  # the state is donated: carry it
    jax.block_until_ready(state)
    name = spec.replace(":", "_").replace(".", "p")
    trace_dir, text = os.path.join(where, name), os.path.join(where, name + ".hlo.txt")
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        for _ in range(2):
            state, _ = step(state, batch)
        jax.block_until_ready(state)
    Path(text).write_text(step.as_text(), encoding="utf-8")
    return trace_dir, text


def trace_rows(rows: list[str], where: str) -> tuple[list, list]:
    """Each row traced (trace_row): ([(trace folder, program file)], [why a row was not])."""
    pairs, failed = [], []
    for spec in rows:
        try:
            pairs.append(trace_row(spec, where))
        except (ValueError, RuntimeError, OSError) as e:  # ConfigError, XLA's, the disk's
            failed.append(f"{spec}: {oneline.first_line(e)}")
    return pairs, failed


def traced_costs(pairs: list[tuple[str, str]], failed: tuple = ()) -> dict[str, Any]:
    """The memory-bound kernels' costs from traced rows (traces.memory_costs over all their
    kernels): `memory_bandwidth` and `kernel_s` from the fit of them all, `memory_kernel_costs`
    each class's, as the H100 profile's were taken by hand from benchmarks/gpu_trace.py. None
    of them where a trace names an instruction for less than NAMED_SHARE of its kernel time
    ("skipped" says why)."""
    rows, shares, names = [], [], []
    for trace_dir, program in pairs:
        joined, total, _, _ = traces.joined(trace_dir, program)
        rows += joined
        shares.append(sum(r[4] for r in joined) / total if total else 0.0)
        names.append(os.path.basename(trace_dir))
    out: dict[str, Any] = {"rows": names, "not_traced": list(failed)}
    if not rows:
        return {**out, "skipped": "no row traced" + (f" ({failed[0]})" if failed else "")}
    out["named_share"] = min(shares)
    if min(shares) < NAMED_SHARE:
        return {
            **out,
            "skipped": f"only {min(shares):.0%} of a trace's kernel time names its "
            "instruction (XLA_FLAGS=--xla_gpu_enable_command_buffer= names all)",
        }
    costs = traces.memory_costs(rows)
    if costs["all"] is None or not costs["classes"]:
        return {**out, "skipped": "too few memory-bound kernels in the traces"}
    (fixed, bandwidth), classes = costs["all"], costs["classes"]
    if not (0 < bandwidth < math.inf):
        return {**out, "skipped": "the memory-bound kernels' fit is not positive"}
    return {
        **out,
        "kernel_s": fixed,
        "memory_bandwidth": bandwidth,
        "memory_kernel_costs": {k: (float(v[0]), float(v[1])) for k, v in classes.items()},
        "kernels": {k: v[0] for k, v in costs["figures"].items() if v[0]},
    }


def trace_and_fit(rows: list[str]) -> dict[str, Any]:
    """trace_rows then traced_costs, in a folder removed afterwards; what went wrong as
    `skipped` rather than an error (the profile is written without these costs)."""
    try:
        with tempfile.TemporaryDirectory() as where:
            return traced_costs(*trace_rows(rows, where))
    except (ValueError, OSError) as e:  # ConfigError and friends
        return {"skipped": oneline.first_line(e)}


def _links(micro: dict[str, Any]) -> tuple[dict, str]:
    """The profile's link ({bandwidth, latency, rings}) and what its docstring says of it."""
    if micro["platform"] == "gpu":
        return {"bandwidth": 100e9, "latency": 5e-6, "rings": 1}, (
            "PLACEHOLDER: NVLink unknown, 100 GB/s and 5 us assumed; replace with nccl-tests' "
            "bus bandwidth"
        )
    n, placeholder = len(jax.devices()), {"bandwidth": 5e9, "latency": 25e-6, "rings": 1}
    if n < 2:
        return placeholder, "PLACEHOLDER: one device here, no link to measure (5 GB/s, 25 us)"
    found = calibrate.measure_links(tuple(k for k in (2, 4, 8) if k <= n), seconds=micro["seconds"])
    bw, lat = found["bandwidth"], found["latency"]
    times = ", ".join(
        f"N={k} {b:,} B: {t * 1e3:.3f} ms" for (k, b), t in found["allreduce_s"].items()
    )
    if not (0 < bw < math.inf and 0 < lat < math.inf):
        return placeholder, f"PLACEHOLDER: the ring fit of psum times ({times}) was not positive"
    return {"bandwidth": bw, "latency": lat, "rings": 1}, (
        f"psum between simulated devices ({times}) fitted to the ring formula "
        f"(calibrate.measure_links): {bw / 1e9:.2f} GB/s, {lat * 1e6:.1f} us per step"
    )


def _docstring(
    path, m: dict, runs: list[dict], names: tuple, link_note: str, table_note: str = ""
) -> str:
    """Where, when and how the profile was measured, and the figures."""
    gpu = m["platform"] == "gpu"
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    kernel = (
        "launch_s"
        if gpu
        else "kernel_s (its fit's start; XLA:CPU runs kernels on the host: launch_s 0)"
    )
    info = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    cpu = next(
        (i.split(":", 1)[1].strip() for i in info if i.startswith("model name")), platform.machine()
    )
    lines = [
        (
            f"{m['num_devices']} x {m['device_kind']} ({m['platform']}), measured {when}, JAX "
            f"{m['jax']}; host {platform.node()}: {cpu}, {os.cpu_count()} cores."
        ),
        *(
            [
                (
                    f"A node of {m['num_devices']} (--here-devices); {m['devices_here']} here, the first "
                    "timed alone."
                )
            ]
            if "devices_here" in m
            else []
        ),
        "",
        f"Made with:  python -m jaxpar.predict --calibrate-here {path}",
        "",
        "Microbenchmarks on the first device (jaxpar/predict/here.py, best of 3 repeats):",
        *(
            f"- {d} matmul GFLOP/s by size: "
            + ", ".join(f"{n}: {r / 1e9:,.1f}" for n, r in m[f"matmul_{d}"].items())
            for d in ("float32", "bfloat16")
            if f"matmul_{d}" in m
        ),
        "  peak_flops: the largest size's rate (the fitted compute_efficiency scales it)",
        *(
            f"- {d} 7x7/2 convolution of 3 channels and its weight gradient: "
            f"{m[f'thin_conv_{d}'] / 1e9:,.1f} GFLOP/s ({m[f'thin_conv_{d}'] / m[f'{d}_flops_per_s']:.3f}"
            " of the matmul's: thin_efficiency)"
            for d in ("float32", "bfloat16")
            if f"thin_conv_{d}" in m
        ),
        *(
            f"- {d} 3x3 convolution over 256 features by its output features n (forward and both "
            "gradients), GFLOP/s: "
            + ", ".join(f"{n}: {r / 1e9:,.0f}" for n, r in m[f"narrow_conv_{d}"].items())
            + f" (tile_width {fit_tile_width(m[f'narrow_conv_{d}']):g}:"
            " n / tile_width of the widest rate below it)"
            for d in ("float32", "bfloat16")
            if f"narrow_conv_{d}" in m
        ),
        (
            f"- memory bandwidth (x * 2 + 1 in place over {m['memory_bandwidth_array_bytes'] >> 20:,}"
            f" MiB): {m['memory_bandwidth'] / 1e9:.2f} GB/s read + written"
        ),
        (
            f"- one small kernel inside a program (chains of 32x32 matmuls): "
            f"{m['kernel_s'] * 1e6:.2f} us -> {kernel}"
        ),
        (
            f"- one tiny jitted program: {m['launch_s'] * 1e6:.1f} us dispatched without waiting "
            f"(-> program_overhead_s), {m['sync_call_s'] * 1e6:.1f} us with a wait after each"
        ),
        f"- memory per device: {m['peak_memory_bytes'] / 2**30:.2f} GiB",
        f"- links: {link_note}",
        *([f"- {table_note}"] if table_note else []),
        *([_traced_note(m["traced"])] if m.get("traced") else []),
        "",
        "Calibration runs, jaxpar's one-device training step (trainer.setup), images/sec:",
        *(f"- {r['name']}: {r['images_per_sec']:,.1f}" for r in runs),
        f"Fitted when the profile loads: {', '.join(names)}.",
    ]
    if not gpu and m["num_devices"] > 1:
        lines += [
            "",
            (
                "compute_pool is not measured (0: each simulated device computes as if "
                "alone): measure it (--calibrate SWEEP --pool) before trusting "
                "multi-device rows."
            ),
        ]
    return "\n".join(textwrap.fill(line, 96, subsequent_indent="  ") for line in lines)


def _traced_note(traced: dict) -> str:
    """What the docstring says of the rows' kernel traces (traced_costs)."""
    if "skipped" in traced:
        return f"- kernel traces of the rows: not used ({traced['skipped']})"
    classes = "; ".join(
        f"{k} {each * 1e6:.2f} us + bytes{' per result' if k == 'reduce_few' else ''} / "
        f"{bw / 1e9:,.2f} GB/s"
        for k, (each, bw) in traced["memory_kernel_costs"].items()
    )
    return (
        f"- kernel traces of {', '.join(traced['rows'])} (command buffers off; "
        f"{traced['named_share']:.0%} or more of each one's kernel time named), their "
        f"memory-bound kernels fitted (jaxpar/predict/traces.py): all of them "
        f"{traced['kernel_s'] * 1e6:.2f} us + bytes / {traced['memory_bandwidth'] / 1e9:,.0f}"
        f" GB/s -> kernel_s, memory_bandwidth; by class -> memory_kernel_costs: {classes}"
    )


def _runs_dtype(runs: list[dict]) -> str:
    """The compute dtype most of the runs use (float32 first on a tie)."""
    dtypes = [r["dtype"] for r in runs] or ["float32"]
    return max(sorted(set(dtypes), key=lambda d: d != "float32"), key=dtypes.count)


def _thin_efficiency(micro: dict, runs: list[dict]) -> float:
    """The thin convolution's rate over peak, in the dtype most of the runs compute in."""
    dtypes = [r["dtype"] for r in runs if f"thin_conv_{r['dtype']}" in micro] or ["float32"]
    dtype = max(set(dtypes), key=dtypes.count)
    return micro[f"thin_conv_{dtype}"] / micro[f"{dtype}_flops_per_s"]


def _tile_width(micro: dict, runs: list[dict]) -> float:
    """The tile width fitted to the narrow convolutions in the runs' compute dtype (0 where
    they were not timed: a CPU, whose narrow kernels are measured otherwise)."""
    rates = micro.get(f"narrow_conv_{_runs_dtype(runs)}") or micro.get("narrow_conv_float32")
    return fit_tile_width(rates) if rates else 0.0


def kernel_table_path(path) -> Path:
    """Where a profile written to `path` keeps its kernel table: beside it, OUT_kernels.csv."""
    return Path(path).with_name(Path(path).stem + "_kernels.csv")


def write_profile(
    path,
    micro: dict,
    runs: list[dict],
    fit_names=DEFAULT_FIT,
    table: tuple[str, list[dict]] | None = None,
) -> str:
    """Write a profile of this machine (the measured figures, links, `calibration_runs` = runs,
    `fit` = fit_names) to `path`, load it back (which fits it) and return a text report.
    `table` (dtype, rows): convolution kernels timed here (time_kernels), written beside the
    profile (kernel_table_path) as its `kernel_benchmarks`: its matrix kernels' costs."""
    gpu, names, table_note = micro["platform"] == "gpu", tuple(fit_names), ""
    link, link_note = _links(micro)
    f32 = micro["float32_flops_per_s"]
    values = {
        "name": f"{micro['num_devices']} x {micro['device_kind']} (measured here)",
        "num_devices": micro["num_devices"],
        "devices_per_node": micro["num_devices"],
        "peak_flops": {"float32": f32, "bfloat16": micro.get("bfloat16_flops_per_s", f32)},
        "memory_bytes": micro["peak_memory_bytes"],
        "memory_bandwidth": micro["memory_bandwidth"],
        "kernel_s": 0.0 if gpu else micro["kernel_s"],
        "launch_s": micro["kernel_s"] * gpu,
        # the first layer's convolutions, in the compute dtype the runs use most
        "thin_efficiency": _thin_efficiency(micro, runs),
        # a GPU's tensor-core tile, from its narrow convolutions (0: not measured, a CPU)
        "tile_width": _tile_width(micro, runs),
        "program_overhead_s": micro["launch_s"],
        "compiler": "gpu" if gpu else "cpu",
        # a GPU's collectives are asynchronous and XLA:GPU schedules them under the backward
        # (overlap.py reads where from the program); XLA:CPU's are not
        "intra": link,
        "inter": link,
        "overlap": None if gpu else 0.0,
        "fit": names,
    }
    if not values["tile_width"]:
        del values["tile_width"]
    traced = micro.get("traced") or {}
    if traced.get("memory_kernel_costs"):  # the rows' own kernel traces (traced_costs)
        values |= {
            "memory_bandwidth": traced["memory_bandwidth"],
            "kernel_s": traced["kernel_s"],
            "memory_kernel_costs": traced["memory_kernel_costs"],
        }
    if table:
        dtype, rows = table
        csv = kernel_table_path(path)
        kernels.write(
            csv,
            rows,
            f"Convolution kernels timed on one {micro['device_kind']} in "
            f"{dtype} by python -m jaxpar.predict --calibrate-here ({len(rows)} "
            "shapes: DeepBench's image layers, then the rows' own (own_shapes); "
            "jaxpar/predict/here.py time_kernels).",
        )
        root = Path(configfile.ROOT).resolve()
        where = csv.resolve()
        values |= {
            "kernel_benchmarks": str(
                where.relative_to(root) if where.is_relative_to(root) else where
            ),
            "kernel_fit": kernels.DEFAULT_FIT,
            "kernel_dtype": dtype,
            # its rows' own layers among them: a step's kernels of those layers at their
            # measured times (Profile.measured_kernels)
            "price_measured": True,
        }
        table_note = (
            f"convolution kernels ({len(rows)} shapes, forward and both gradients, "
            f"{dtype}) timed into {csv.name}: the matrix kernels' costs "
            f"({', '.join(kernels.DEFAULT_FIT)}), fitted to them as the profile loads"
        )
    fmt = lambda v: pprint.pformat(v, width=96, sort_dicts=False)
    source = "".join(
        [
            f'"""{_docstring(path, micro, runs, names, link_note, table_note)}\n"""\n\nimport ml_collections\n\n',
            f"MEASURED = {fmt(micro)}\nRUNS = [\n",
            *(textwrap.indent(f"{fmt(r)},\n", "    ") for r in runs),
            "]\n\n\ndef get_config():\n    c = ml_collections.ConfigDict()\n",
            *(f"    c.{k} = {fmt(v)}\n" for k, v in values.items()),
            "    c.calibration_runs = RUNS\n    return c\n",
        ]
    )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(source, encoding="utf-8")
    cmd = f"--profile {path} --config configs/vgg19_hybrid.py"
    return "\n".join(
        [
            f"wrote {path}",
            source.split('"""')[1].strip(),
            "",
            fit_report(path),
            "",
            "next:",
            f"  python -m jaxpar.plan {cmd}",
            f"  python -m jaxpar.predict {cmd}",
        ]
    )


def fit_report(path) -> str:
    """Load the profile (which fits it) and report its fit, its programs compiled for the CPU
    as the predictor compiles them: on an accelerator, in a CPU-only subprocess."""
    if jax.devices()[0].platform == "cpu":
        profile, c = fitting.load_profile(path), configfile.load(str(path))
        return calibrate.report(profile, [dict(r) for r in c.calibration_runs], tuple(c.fit))
    code = "import sys; from jaxpar.predict import here; print(here.fit_report(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(Path(path).resolve())],
        check=False,
        cwd=configfile.ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise ConfigError(f"fitting {path}: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return done.stdout.rstrip()
