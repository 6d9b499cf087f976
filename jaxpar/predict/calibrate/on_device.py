"""`python -m jaxpar.predict --calibrate-here OUT.py`: a hardware profile of this machine
(configs/hardware/*.py format) from microbenchmarks of its first device (matmul FLOP/s, memory
bandwidth, a small kernel's and a program dispatch's cost, memory; on a GPU the first layer's
convolutions and narrow layers' by their features: thin_efficiency, tile_width) and jaxpar's one-device
training step timed on a few models (`--here-rows`): its `calibration_runs`, fitted on loading.
On a GPU also 24 convolution shapes of DeepBench's and up to 24 of the rows' own models timed
into a kernel table (its matrix kernels' costs), and
two steps of each row traced with XLA's command buffers off (trace_rows), whose memory-bound
kernels give the profile's memory_bandwidth, kernel_s and memory_kernel_costs (traced_costs,
jaxpar/predict/calibrate/traces.py): what the H100 profile's were fitted from by hand.

This module is the command (its flags, the plan of rows and costs checked before anything is
timed, the run); device_rates.py holds the microbenchmarks, model_runs.py the rows' timing and
tracing, profile_file.py the profile file written and its docstring.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import jax

from jaxpar import oneline
from jaxpar.errors import ConfigError
from jaxpar.predict.calibrate import device_rates, model_runs, profile_file
from jaxpar.predict.kernels import kernel_table
from jaxpar.predict.profiles import fitting

CPU_ROWS = ("vgg19:0.25:32:float32:32", "resnet20:1.0:32:float32:32")
GPU_ROWS = (
    "vgg19:1.0:32:float32:128",
    "vgg19:1.0:32:bfloat16:512",
    "resnet50:1.0:224:bfloat16:128",
    "resnet20:1.0:32:float32:128",
)
# on a GPU, once its matrix kernels' costs come from its own kernel table (kernel_table.py): the
# per-kernel time of every kernel, fitted to the model rows
KERNEL_TABLE_FIT = ("kernel_s",)
# and once the rows' own kernel traces have given the memory-bound kernels' costs and the
# per-kernel time (traced_costs): what a matrix kernel costs inside a step beyond its price
TRACED_FIT = ("matmul_kernel_s",)


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
    names = tuple(n.strip() for n in given if n.strip()) or profile_file.DEFAULT_FIT[: len(rows)]
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
    return [model_runs.parse_row(r).name for r in rows], names


def run(args) -> int:
    """--calibrate-here: measure, write the profile, print the report; 2 on a refusal."""
    try:
        rows, names = _plan(args)
        t0 = time.perf_counter()
        micro = device_rates.microbenchmarks(min(0.5, args.here_seconds))
        t1 = time.perf_counter()
        runs = model_runs.model_runs(rows, args.here_seconds)
        table = None
        if micro.platform == "gpu":  # the matrix kernels' costs from kernels of its own
            dtype = profile_file.runs_dtype(runs)
            shapes = kernel_table.vision_rows(
                kernel_table.load(kernel_table.SHIPPED)
            ) + device_rates.own_shapes(rows, dtype)
            table = (dtype, device_rates.time_kernels(shapes, dtype, min(0.2, args.here_seconds)))
            micro = dataclasses.replace(micro, traced=model_runs.trace_and_fit(rows))
            if not getattr(args, "here_fit", None):  # what the table and traces do not hold
                names = TRACED_FIT if micro.traced.memory_kernel_costs else KERNEL_TABLE_FIT
        t2 = time.perf_counter()
        if getattr(args, "here_devices", None):
            micro = dataclasses.replace(
                micro, devices_here=micro.num_devices, num_devices=args.here_devices
            )
        text = profile_file.write_profile(args.calibrate_here, micro, runs, names, table)
    except ValueError as e:  # ConfigError and friends
        oneline.print_error(oneline.first_line(e))
        return 2
    print(text)
    print(
        f"\ntook {time.perf_counter() - t0:.1f} s: microbenchmarks {t1 - t0:.1f} s, model "
        f"runs {t2 - t1:.1f} s, links, fit and report {time.perf_counter() - t2:.1f} s"
    )
    return 0
