"""--calibrate-here's rows (MODEL:WIDTH:IMAGE:DTYPE:BATCH): jaxpar's one-device training step
of each timed on the first device (`model_runs`, the profile's calibration runs), and on a GPU
traced with XLA's command buffers off (`trace_rows`), whose memory-bound kernels give the
profile's memory_bandwidth, kernel_s and memory_kernel_costs (`traced_costs`,
jaxpar/predict/calibrate/traces.py)."""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from pathlib import Path

import jax

from jaxpar import analysis, models, oneline, run_setup
from jaxpar.errors import ConfigError
from jaxpar.predict.calibrate import timer, traces
from jaxpar.predict.calibrate.records import TracedCosts
from jaxpar.predict.profiles.calibration_runs import run_config
from jaxpar.predict.profiles.records import CalibrationRun

# the share of a traced step's kernel time that must name an instruction of its program for
# its costs to be fitted (XLA's command buffers hide the names of what they hold)
NAMED_SHARE = 0.9
# the keys a row's run is written with, in order (then its images_per_sec)
_ROW_KEYS = tuple(f.name for f in dataclasses.fields(CalibrationRun))[:9]


def parse_row(spec: str) -> CalibrationRun:
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
    return CalibrationRun(
        name=spec,
        model=model,
        width=width,
        batch_norm=True,
        head="auto",
        image_shape=(image, image, 3),
        num_classes=10,
        dtype=dtype,
        batch_size=batch,
        keys=_ROW_KEYS,
    )


def _images_per_sec(run: CalibrationRun, seconds: float) -> float:
    """jaxpar's one-device training step of `run` (run_setup.setup on the first device, as
    benchmarks/single_device.py times it): compiled and warmed up, then timed for about
    `seconds`, dispatched without waiting and the device synchronised at the end."""

    s = run_setup.setup(run_config(run), [jax.devices()[0]])
    state = s.strategy.init_state(jax.random.key(0))
    batch = s.strategy.put_batch(run_setup.local_train_batch(s, 0))

    step = timer.carrying(s.strategy.train_step, state, batch)  # the state is donated
    timed = timer.measure(step, seconds, warmup=3, min_calls=3, window=None)
    return run.batch_size / timed.best


def model_runs(rows: list[str], seconds: float) -> list[CalibrationRun]:
    """Each row (MODEL:WIDTH:IMAGE:DTYPE:BATCH) as a calibration run with its measured
    `images_per_sec` on this machine's first device."""
    return [
        dataclasses.replace(r, images_per_sec=_images_per_sec(r, seconds))
        for r in map(parse_row, rows)
    ]


def trace_row(spec: str, where: str) -> tuple[str, str]:
    """jaxpar's one-device training step of a row (MODEL:WIDTH:IMAGE:DTYPE:BATCH) on the first
    device, compiled with XLA's command buffers off (so that every kernel of a GPU's trace
    names its instruction; the rows' speed is timed as a user runs, with them on), warmed up,
    two steps traced under JAX's profiler into where/NAME, and the program traced written to
    where/NAME.hlo.txt: (trace folder, program file), what traces.joined reads."""

    run = parse_row(spec)
    s = run_setup.setup(run_config(run), [jax.devices()[0]])
    (program,) = analysis.programs(s.strategy, run.batch_size)
    step = program.lowered.compile(compiler_options={"xla_gpu_enable_command_buffer": ""})
    state = s.strategy.init_state(jax.random.key(0))
    batch = s.strategy.put_batch(run_setup.local_train_batch(s, 0))
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


def traced_costs(pairs: list[tuple[str, str]], failed: tuple = ()) -> TracedCosts:
    """The memory-bound kernels' costs from traced rows (traces.memory_costs over all their
    kernels): `memory_bandwidth` and `kernel_s` from the fit of them all, `memory_kernel_costs`
    each class's, as the H100 profile's were taken by hand from benchmarks/gpu_trace.py. None
    of them where a trace names an instruction for less than NAMED_SHARE of its kernel time
    ("skipped" says why)."""
    rows, shares, names = [], [], []
    for trace_dir, program in pairs:
        joined = traces.joined(trace_dir, program)
        rows += joined.kernels
        total = joined.total_s
        shares.append(sum(r.seconds for r in joined.kernels) / total if total else 0.0)
        names.append(os.path.basename(trace_dir))
    out = TracedCosts(rows=names, not_traced=list(failed))
    if not rows:
        return dataclasses.replace(
            out, skipped="no row traced" + (f" ({failed[0]})" if failed else "")
        )
    out = dataclasses.replace(out, named_share=min(shares))
    if min(shares) < NAMED_SHARE:
        return dataclasses.replace(
            out,
            skipped=f"only {min(shares):.0%} of a trace's kernel time names its "
            "instruction (XLA_FLAGS=--xla_gpu_enable_command_buffer= names all)",
        )
    costs = traces.memory_costs(rows)
    if costs.all is None or not costs.classes:
        return dataclasses.replace(out, skipped="too few memory-bound kernels in the traces")
    (fixed, bandwidth), classes = costs.all, costs.classes
    if not (0 < bandwidth < math.inf):
        return dataclasses.replace(out, skipped="the memory-bound kernels' fit is not positive")
    return dataclasses.replace(
        out,
        kernel_s=fixed,
        memory_bandwidth=bandwidth,
        memory_kernel_costs={k: (float(v[0]), float(v[1])) for k, v in classes.items()},
        kernels={k: v.kernels for k, v in costs.figures.items() if v.kernels},
    )


def trace_and_fit(rows: list[str]) -> TracedCosts:
    """trace_rows then traced_costs, in a folder removed afterwards; what went wrong as
    `skipped` rather than an error (the profile is written without these costs)."""
    try:
        with tempfile.TemporaryDirectory() as where:
            return traced_costs(*trace_rows(rows, where))
    except (ValueError, OSError) as e:  # ConfigError and friends
        return TracedCosts(skipped=oneline.first_line(e))


def traced_note(traced: TracedCosts) -> str:
    """What the docstring says of the rows' kernel traces (traced_costs)."""
    if traced.skipped is not None:
        return f"- kernel traces of the rows: not used ({traced.skipped})"
    classes = "; ".join(
        f"{k} {each * 1e6:.2f} us + bytes{' per result' if k == 'reduce_few' else ''} / "
        f"{bw / 1e9:,.2f} GB/s"
        for k, (each, bw) in traced.memory_kernel_costs.items()
    )
    return (
        f"- kernel traces of {', '.join(traced.rows)} (command buffers off; "
        f"{traced.named_share:.0%} or more of each one's kernel time named), their "
        f"memory-bound kernels fitted (jaxpar/predict/calibrate/traces.py): all of them "
        f"{traced.kernel_s * 1e6:.2f} us + bytes / {traced.memory_bandwidth / 1e9:,.0f}"
        f" GB/s -> kernel_s, memory_bandwidth; by class -> memory_kernel_costs: {classes}"
    )
