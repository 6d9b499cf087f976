"""What a model's own convolutions cost on a GPU, shape by shape, against what a profile
prices them at: the measurement issue 36's predictor needs for Inception-v3 (docs/predict.md,
"What the validation says": too fast on every GPU profile, and DeepBench's P100 table, which
the DGX-1's matrix costs rest on, holds no 1x7, 7x1, 1x3 or 3x1 shape, nor 3x3 layers on 8x8
or 17x17 maps).

    XLA_FLAGS=--xla_gpu_enable_command_buffer= python benchmarks/conv_micro.py \
        --rows inception_v3:1:299:bfloat16:64 --profile configs/hardware/h100_here.py \
        --out runs/conv.json --table runs/inception_v3_kernels.csv

Every convolution of the model's forward (read from its jaxpr, so any model of jaxpar's
registry or a builder of one's own) is one row of kernel_table.py's table format (W, H, C, N, K,
R, S, padding, strides), identical layers counted once with their number. Each row's forward,
input gradient and filter gradient is a jitted program of its own, called a few times under
JAX's profiler; the convolution kernels' device time per call is read from the trace
(benchmarks/reduce_micro.py reads traces the same way), so dispatch does not count. Printed
per kernel: measured and priced microseconds (kernel_table.price: the profile's device time of that
kernel alone) and their ratio; then per group of shapes (1x1, asymmetric 1xN and Nx1, 3x3
stride 1, strided, other) the layers' time weighted by their number, measured against priced.
`--table` writes the measured times as a kernel table (configs/hardware/kernels/*.csv's
format) that a profile can name as its `kernel_benchmarks`. On a CPU it runs too (--small:
two small models' first shapes, a smoke test).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KINDS = (
    ("forward", "forward_ms"),
    ("input gradient", "input_grad_ms"),
    ("filter gradient", "filter_grad_ms"),
)
SMALL = ["resnet20:0.25:32:float32:2"]


def measure(row, dtype: str, calls: int = 5) -> dict:
    """One shape's (a kernel_table.ConvRow) forward, input gradient and filter gradient, each a
    jitted program traced over `calls` calls: its table columns with milliseconds per call of
    its convolution kernels (the trace's kernels named after a convolution; all of the
    program's kernels apart, as `*_all_ms`)."""
    import jax
    import jax.numpy as jnp

    from benchmarks.reduce_micro import _gpu_events

    n, h, w, c, k, r, s = row.n, row.h, row.w, row.c, row.k, row.r, row.s
    strides = (row.stride_h, row.stride_w)
    pad = [(row.pad_h,) * 2, (row.pad_w,) * 2]
    x = jax.device_put(jnp.ones((n, h, w, c), dtype))
    f = jax.device_put(jnp.ones((r, s, c, k), dtype) * 0.01)

    def conv(x, f):
        return jax.lax.conv_general_dilated(
            x, f, strides, pad, dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    y = jax.device_put(jnp.ones(jax.eval_shape(conv, x, f).shape, dtype))
    programs = {
        "forward_ms": (jax.jit(conv), (x, f)),
        "input_grad_ms": (
            jax.jit(lambda x, f, y: jax.vjp(lambda v: conv(v, f), x)[1](y)[0]),
            (x, f, y),
        ),
        "filter_grad_ms": (
            jax.jit(lambda x, f, y: jax.vjp(lambda v: conv(x, v), f)[1](y)[0]),
            (x, f, y),
        ),
    }
    out = row.as_record()
    for column, (fn, args) in programs.items():
        for _ in range(2):
            jax.block_until_ready(fn(*args))
        names = _matrix_kernels(fn.lower(*args).compile().as_text())
        with tempfile.TemporaryDirectory() as where:
            with jax.profiler.trace(where, create_perfetto_trace=True):
                for _ in range(calls):
                    result = fn(*args)
                jax.block_until_ready(result)
            events, device = _gpu_events(where)
        if device == "cpu":  # XLA:CPU's events: its thunks, named after their instructions
            events = [(name, t) for name, t in events if name in names[1]]
        convs = [t for name, t in events if name in names[0]]
        out[column] = 1e3 * sum(convs) / calls
        out[column.replace("_ms", "_all_ms")] = 1e3 * sum(t for _, t in events) / calls
        out["device"] = device
    return out


def _matrix_kernels(text: str) -> tuple[set[str], set[str]]:
    """(the program's convolution kernels, all its kernels): the names of its entry's
    instructions that are a convolution, a library call of one (cuDNN's custom calls on a
    GPU), or a fusion around one; and of all its entry's instructions."""
    from jaxpar import hlo

    program = hlo.parse(text)

    def convolves(ins: hlo.Instruction, depth: int = 0) -> bool:
        if ins.opcode == "convolution" or (
            ins.opcode == "custom-call" and "conv" in ins.rest.lower()
        ):
            return True
        return bool(
            ins.opcode == "fusion"
            and ins.callees
            and depth < 4
            and any(convolves(inner, depth + 1) for inner in program.body(ins.callees[0]))
        )

    return (
        {ins.name for ins in program.entry if convolves(ins)},
        {ins.name for ins in program.entry},
    )


def group(row) -> str:
    """The shape's (a kernel_table.ConvRow) group: 1x1, asymmetric (1xN or Nx1), 3x3 stride 1,
    strided, or other."""
    r, s = row.r, row.s
    if row.stride_h > 1 or row.stride_w > 1:
        return "strided"
    if r == s == 1:
        return "1x1"
    if r == 1 or s == 1:
        return "1xN / Nx1"
    return f"{r}x{s} stride 1"


def compare(measured: list[dict], counts: list[int], profile, dtype: str) -> list[dict]:
    """Each measured kernel beside the profile's price of it (kernel_table.price), per layer."""
    from jaxpar.predict.kernels import kernel_table

    size = 2 if dtype == "bfloat16" else 4
    out = []
    for timed_row, count in zip(measured, counts):
        row = kernel_table.ConvRow.of_record(timed_row)
        timed = kernel_table.kernels(row, size)  # none for a thin first layer
        for kind, column in KINDS:
            kernel = next((k for k in timed if k.name.endswith(kind)), None)
            out.append(
                {
                    "shape": _label(row),
                    "group": group(row),
                    "kind": kind,
                    "layers": count,
                    "measured_s": timed_row[column] * 1e-3,
                    "priced_s": kernel_table.price(profile, kernel, dtype) if kernel else None,
                }
            )
    return out


def _label(row) -> str:
    return f"{row.r}x{row.s} s{row.stride_h} {row.w}x{row.h}x{row.c}->{row.k} n{row.n}"


def summary(lines: list[dict]) -> dict[str, tuple[float, float, int]]:
    """Per group, and "all": (measured s, priced s, kernels), each kernel times its layers;
    kernels the profile does not price (a thin first layer) left out."""
    total: dict[str, list] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for line in lines:
        if line["priced_s"] is None:
            continue
        for name in (line["group"], "all"):
            t = total[name]
            t[0] += line["layers"] * line["measured_s"]
            t[1] += line["layers"] * line["priced_s"]
            t[2] += line["layers"]
    return {k: tuple(v) for k, v in total.items()}


def _write_table(path: str, rows: list[dict], args, device: str) -> None:
    from jaxpar.predict.kernels import kernel_table

    what = SMALL[0] if args.small else args.rows
    kernel_table.write(
        path,
        [kernel_table.ConvRow.of_record(r) for r in rows],
        f"Convolution kernels of {what} timed on {device} "
        "(benchmarks/conv_micro.py): milliseconds per call of the convolution kernels "
        "of each program, from a profiler trace",
    )


def main(argv=None) -> int:
    from jaxpar.errors import ConfigError
    from jaxpar.predict import load_profile
    from jaxpar.predict.calibrate import model_runs
    from jaxpar.predict.kernels import model_layers

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows",
        default="inception_v3:1:299:bfloat16:64",
        help="MODEL:WIDTH:IMAGE:DTYPE:BATCH, comma-separated",
    )
    parser.add_argument("--profile", default="configs/hardware/h100_here.py")
    parser.add_argument("--out", help="write every kernel here (JSON)")
    parser.add_argument("--table", help="write the measured times as a kernel table (CSV)")
    parser.add_argument("--limit", type=int, default=0, help="the first N shapes of each row")
    parser.add_argument("--small", action="store_true", help="a small model (a smoke test)")
    args = parser.parse_args(argv)
    try:
        if not os.path.isfile(args.profile):  # loaded once measured (it compiles its fits)
            load_profile(args.profile)  # its one-line error
        runs = [model_runs.parse_row(r) for r in (SMALL if args.small else args.rows.split(","))]
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    everything, table, profile = [], [], None
    for run in runs:
        shapes = model_layers.model_rows(run)[: args.limit or None]
        print(f"{run.name}: {len(shapes)} shapes, {sum(n for _, n in shapes)} layers")
        measured = []
        for row, _ in shapes:  # the table rewritten after each shape: a time limit keeps it
            measured.append(measure(row, run.dtype))
            print(
                f"  {_label(row):>34}: "
                + ", ".join(
                    f"{kind} {measured[-1][column] * 1e3:.1f} us" for kind, column in KINDS
                ),
                flush=True,
            )
            if args.table:
                _write_table(args.table, table + measured, args, measured[-1]["device"])
        table += measured
        profile = profile or load_profile(args.profile)
        lines = compare(measured, [n for _, n in shapes], profile, run.dtype)
        print(
            f"{'shape':>34} {'kind':>16} {'layers':>6} {'measured us':>11} "
            f"{'priced us':>9} {'ratio':>6}"
        )
        for line in lines:
            priced = line["priced_s"]
            ratio = f"{line['measured_s'] / priced:6.2f}" if priced else "     -"
            print(
                f"{line['shape']:>34} {line['kind']:>16} {line['layers']:6d} "
                f"{line['measured_s'] * 1e6:11.1f} "
                f"{priced * 1e6 if priced else float('nan'):9.1f} {ratio}"
            )
        print(f"\n{run.name} on {args.profile}, each kernel times its layers:")
        for name, (m, p, n) in sorted(summary(lines).items(), key=lambda kv: kv[0] == "all"):
            print(
                f"  {name:>14}: {n:4d} kernels, measured {m * 1e3:8.3f} ms, priced "
                f"{p * 1e3:8.3f} ms, ratio {m / p if p else float('nan'):.2f}"
            )
        everything.append(
            {
                "row": run.name,
                "device": measured[0]["device"] if measured else None,
                "kernels": lines,
            }
        )
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(everything, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
