"""--calibrate-here's profile file: the measured figures (device_rates.microbenchmarks), the rows
(model_runs.model_runs), the links, the kernel table and the costs to fit written as a
configs/hardware/*.py file with a docstring that says where, when and how each was measured;
then loaded back (which fits it) and its fit reported."""

from __future__ import annotations

import datetime
import math
import os
import platform
import pprint
import subprocess
import sys
import textwrap
from pathlib import Path

import jax

from jaxpar import configfile
from jaxpar.errors import ConfigError
from jaxpar.predict.calibrate import from_runs, model_runs
from jaxpar.predict.calibrate.device_rates import fit_tile_width
from jaxpar.predict.calibrate.records import Microbenchmarks
from jaxpar.predict.comm import cpulinks
from jaxpar.predict.kernels import kernel_table
from jaxpar.predict.profiles import fitting
from jaxpar.predict.profiles.records import CalibrationRun

DEFAULT_FIT = ("compute_efficiency", "kernel_s")


def _links(micro: Microbenchmarks) -> tuple[dict, str]:
    """The profile's link ({bandwidth, latency, rings}) and what its docstring says of it."""
    if micro.platform == "gpu":
        return {"bandwidth": 100e9, "latency": 5e-6, "rings": 1}, (
            "PLACEHOLDER: NVLink unknown, 100 GB/s and 5 us assumed; replace with nccl-tests' "
            "bus bandwidth"
        )
    n, placeholder = len(jax.devices()), {"bandwidth": 5e9, "latency": 25e-6, "rings": 1}
    if n < 2:
        return placeholder, "PLACEHOLDER: one device here, no link to measure (5 GB/s, 25 us)"
    found = cpulinks.measure_links(tuple(k for k in (2, 4, 8) if k <= n), seconds=micro.seconds)
    bw, lat = found.bandwidth, found.latency
    times = ", ".join(f"N={k} {b:,} B: {t * 1e3:.3f} ms" for (k, b), t in found.allreduce_s.items())
    if not (0 < bw < math.inf and 0 < lat < math.inf):
        return placeholder, f"PLACEHOLDER: the ring fit of psum times ({times}) was not positive"
    return {"bandwidth": bw, "latency": lat, "rings": 1}, (
        f"psum between simulated devices ({times}) fitted to the ring formula "
        f"(cpulinks.measure_links): {bw / 1e9:.2f} GB/s, {lat * 1e6:.1f} us per step"
    )


def _docstring(
    path,
    m: Microbenchmarks,
    runs: list[CalibrationRun],
    names: tuple,
    link_note: str,
    table_note: str = "",
) -> str:
    """Where, when and how the profile was measured, and the figures."""
    gpu = m.platform == "gpu"
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
            f"{m.num_devices} x {m.device_kind} ({m.platform}), measured {when}, JAX "
            f"{m.jax}; host {platform.node()}: {cpu}, {os.cpu_count()} cores."
        ),
        *(
            [
                (
                    f"A node of {m.num_devices} (--here-devices); {m.devices_here} here, the first "
                    "timed alone."
                )
            ]
            if m.devices_here is not None
            else []
        ),
        "",
        f"Made with:  python -m jaxpar.predict --calibrate-here {path}",
        "",
        "Microbenchmarks on the first device (jaxpar/predict/calibrate/device_rates.py, best of 3 repeats):",
        *(
            f"- {d} matmul GFLOP/s by size: "
            + ", ".join(f"{n}: {r / 1e9:,.1f}" for n, r in m.matmul[d].items())
            for d in ("float32", "bfloat16")
            if d in m.matmul
        ),
        "  peak_flops: the largest size's rate (the fitted compute_efficiency scales it)",
        *(
            f"- {d} 7x7/2 convolution of 3 channels and its weight gradient: "
            f"{m.thin_conv[d] / 1e9:,.1f} GFLOP/s ({m.thin_conv[d] / m.flops_per_s[d]:.3f}"
            " of the matmul's: thin_efficiency)"
            for d in ("float32", "bfloat16")
            if d in m.thin_conv
        ),
        *(
            f"- {d} 3x3 convolution over 256 features by its output features n (forward and both "
            "gradients), GFLOP/s: "
            + ", ".join(f"{n}: {r / 1e9:,.0f}" for n, r in m.narrow_conv[d].items())
            + f" (tile_width {fit_tile_width(m.narrow_conv[d]):g}:"
            " n / tile_width of the widest rate below it)"
            for d in ("float32", "bfloat16")
            if d in m.narrow_conv
        ),
        (
            f"- memory bandwidth (x * 2 + 1 in place over {m.memory_bandwidth_array_bytes >> 20:,}"
            f" MiB): {m.memory_bandwidth / 1e9:.2f} GB/s read + written"
        ),
        (
            f"- one small kernel inside a program (chains of 32x32 matmuls): "
            f"{m.kernel_s * 1e6:.2f} us -> {kernel}"
        ),
        (
            f"- one tiny jitted program: {m.launch_s * 1e6:.1f} us dispatched without waiting "
            f"(-> program_overhead_s), {m.sync_call_s * 1e6:.1f} us with a wait after each"
        ),
        f"- memory per device: {m.peak_memory_bytes / 2**30:.2f} GiB",
        f"- links: {link_note}",
        *([f"- {table_note}"] if table_note else []),
        *([model_runs.traced_note(m.traced)] if m.traced else []),
        "",
        "Calibration runs, jaxpar's one-device training step (run_setup.setup), images/sec:",
        *(f"- {r.name}: {r.images_per_sec:,.1f}" for r in runs),
        f"Fitted when the profile loads: {', '.join(names)}.",
    ]
    if not gpu and m.num_devices > 1:
        lines += [
            "",
            (
                "compute_pool is not measured (0: each simulated device computes as if "
                "alone): measure it (--calibrate SWEEP --pool) before trusting "
                "multi-device rows."
            ),
        ]
    return "\n".join(textwrap.fill(line, 96, subsequent_indent="  ") for line in lines)


def runs_dtype(runs: list[CalibrationRun]) -> str:
    """The compute dtype most of the runs use (float32 first on a tie)."""
    dtypes = [r.dtype for r in runs] or ["float32"]
    return max(sorted(set(dtypes), key=lambda d: d != "float32"), key=dtypes.count)


def _thin_efficiency(micro: Microbenchmarks, runs: list[CalibrationRun]) -> float:
    """The thin convolution's rate over peak, in the dtype most of the runs compute in."""
    dtypes = [r.dtype for r in runs if r.dtype in micro.thin_conv] or ["float32"]
    dtype = max(set(dtypes), key=dtypes.count)
    return micro.thin_conv[dtype] / micro.flops_per_s[dtype]


def _tile_width(micro: Microbenchmarks, runs: list[CalibrationRun]) -> float:
    """The tile width fitted to the narrow convolutions in the runs' compute dtype, else in
    float32 (0 where they were not timed: a CPU, whose narrow kernels are measured otherwise)."""
    timed = [micro.narrow_conv[d] for d in (runs_dtype(runs), "float32") if d in micro.narrow_conv]
    return fit_tile_width(timed[0]) if timed and timed[0] else 0.0


def kernel_table_path(path) -> Path:
    """Where a profile written to `path` keeps its kernel table: beside it, OUT_kernels.csv."""
    return Path(path).with_name(Path(path).stem + "_kernels.csv")


def write_profile(
    path,
    micro: Microbenchmarks,
    runs: list[CalibrationRun],
    fit_names=DEFAULT_FIT,
    table: tuple[str, list[kernel_table.ConvRow]] | None = None,
) -> str:
    """Write a profile of this machine (the measured figures, links, `calibration_runs` = runs,
    `fit` = fit_names) to `path`, load it back (which fits it) and return a text report.
    `table` (dtype, rows): convolution kernels timed here (time_kernels), written beside the
    profile (kernel_table_path) as its `kernel_benchmarks`: its matrix kernels' costs."""
    gpu, names, table_note = micro.platform == "gpu", tuple(fit_names), ""
    link, link_note = _links(micro)
    f32 = micro.matmul_flops_per_s  # float32's, which a dtype not timed takes
    peak = {d: micro.flops_per_s.get(d, f32) for d in ("float32", "bfloat16")}
    values = {
        "name": f"{micro.num_devices} x {micro.device_kind} (measured here)",
        "num_devices": micro.num_devices,
        "devices_per_node": micro.num_devices,
        "peak_flops": peak,
        "memory_bytes": micro.peak_memory_bytes,
        "memory_bandwidth": micro.memory_bandwidth,
        "kernel_s": 0.0 if gpu else micro.kernel_s,
        "launch_s": micro.kernel_s * gpu,
        # the first layer's convolutions, in the compute dtype the runs use most
        "thin_efficiency": _thin_efficiency(micro, runs),
        # a GPU's tensor-core tile, from its narrow convolutions (0: not measured, a CPU)
        "tile_width": (tile := _tile_width(micro, runs)),
        "program_overhead_s": micro.launch_s,
        "compiler": "gpu" if gpu else "cpu",
        # a GPU's collectives are asynchronous and XLA:GPU schedules them under the backward
        # (overlap.py reads where from the program); XLA:CPU's are not
        "intra": link,
        "inter": link,
        "overlap": None if gpu else 0.0,
        "fit": names,
    }
    if not tile:
        del values["tile_width"]
    traced = micro.traced
    if traced and traced.memory_kernel_costs:  # the rows' own kernel traces (traced_costs)
        values |= {
            "memory_bandwidth": traced.memory_bandwidth,
            "kernel_s": traced.kernel_s,
            "memory_kernel_costs": traced.memory_kernel_costs,
        }
    if table:
        dtype, rows = table
        csv = kernel_table_path(path)
        kernel_table.write(
            csv,
            rows,
            f"Convolution kernels timed on one {micro.device_kind} in "
            f"{dtype} by python -m jaxpar.predict --calibrate-here ({len(rows)} "
            "shapes: DeepBench's image layers, then the rows' own (own_shapes); "
            "jaxpar/predict/calibrate/device_rates.py time_kernels).",
        )
        root = Path(configfile.ROOT).resolve()
        where = csv.resolve()
        values |= {
            "kernel_benchmarks": str(
                where.relative_to(root) if where.is_relative_to(root) else where
            ),
            "kernel_fit": kernel_table.DEFAULT_FIT,
            "kernel_dtype": dtype,
            # its rows' own layers among them: a step's kernels of those layers at their
            # measured times (hardware.Kernels.measured_kernels)
            "price_measured": True,
        }
        table_note = (
            f"convolution kernels ({len(rows)} shapes, forward and both gradients, "
            f"{dtype}) timed into {csv.name}: the matrix kernels' costs "
            f"({', '.join(kernel_table.DEFAULT_FIT)}), fitted to them as the profile loads"
        )
    fmt = lambda v: pprint.pformat(v, width=96, sort_dicts=False)
    source = "".join(
        [
            f'"""{_docstring(path, micro, runs, names, link_note, table_note)}\n"""\n\nimport ml_collections\n\n',
            f"MEASURED = {fmt(micro.as_record())}\nRUNS = [\n",
            *(textwrap.indent(f"{fmt(r.as_record())},\n", "    ") for r in runs),
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
        runs = [CalibrationRun.of_record(r) for r in c.calibration_runs]
        return from_runs.report(profile, runs, tuple(c.fit))
    code = (
        "import sys; from jaxpar.predict.calibrate import profile_file; "
        "print(profile_file.fit_report(sys.argv[1]))"
    )
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
