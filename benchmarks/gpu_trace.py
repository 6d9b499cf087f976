"""Where one training step's time goes on a GPU, kernel by kernel: a profiler trace of the step
joined with its compiled program (what docs/predict.md's "Figures measured on lent GPUs"
were read from).

    XLA_FLAGS=--xla_gpu_enable_command_buffer= python benchmarks/single_device.py \\
        --rows resnet50:224:bfloat16:128 --trace-dir runs/trace --hlo-dir runs/hlo   # on the GPU
    python benchmarks/gpu_trace.py runs/trace/resnet50_224_bfloat16_128 \\
        runs/hlo/resnet50_224_bfloat16_128.hlo.txt.gz                                # anywhere

Without command buffers (the flag above, which changes the step's time a little) every kernel of the trace
names the HLO instruction it runs (`hlo_op`), so each kernel's time is joined with that
instruction's FLOPs (convolutions and matrix products, from their shapes) and bytes (its
operands and its result). Prints the matrix kernels (their rate; the thin ones, over fewer
than 8 input channels, apart), the memory-bound kernels (their bandwidth by size, and the
least-squares fit of time = a fixed cost + bytes / bandwidth, for all of them and for each
class: elementwise, reduce, transpose, window, as opclass.memory_class names them) and the
longest kernels. The trace holds two steps (single_device.py's --trace-dir); their mean is
reported. More TRACE_DIR HLO pairs after the first: each row reported, then the memory-bound
kernels of all of them fitted together by class (a profile's memory_kernel_costs; the H100's
come from ResNet-50's and AlexNet's rows, docs/predict.md).

A CPU's trace joins the same way (docs/predict.md, "This machine"): XLA:CPU names each of its
kernels (thunks) after the top-level instruction it runs, and a fusion's convolutions and
dots are its matrix work. XLA:CPU runs independent kernels at once, so their times overlap
and can sum to more than the step, and the memory-bound fit is loose there.

    python benchmarks/single_device.py --rows vgg19:0.25:32:float32:64 --trace-dir /tmp/t \
        --hlo-dir /tmp/h                       # MODEL:WIDTH:IMAGE:DTYPE:BATCH, here
    python benchmarks/gpu_trace.py /tmp/t/vgg19_0p25_32_float32_64 /tmp/h/vgg19_0p25_32_float32_64.hlo.txt.gz
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxpar.predict.calibrate.traces import (  # noqa: F401  (re-exported: tests, scripts)
    COLUMNS,
    cpu_matrix_flops,
    fit_line,
    joined,
    kernel_class,
    kernel_times,
    largest_reduction,
    memory_costs,
    read_csv,
    write_csv,
)


def _memory_bound(mem: list[tuple]) -> None:
    """The memory-bound kernels: their bandwidth by size, and time = fixed + bytes / bandwidth,
    for all and for each class (a profile's memory_kernel_costs)."""
    b, t = np.array([r[3] for r in mem]), np.array([r[4] for r in mem])
    print(
        f"memory-bound: {len(mem):5d} instructions {t.sum() * 1e3:8.2f} ms {b.sum() / 1e9:7.2f} GB "
        f"{b.sum() / t.sum() / 1e9:7.0f} GB/s"
    )
    for lo, hi in ((0, 1e6), (1e6, 16e6), (16e6, 64e6), (64e6, math.inf)):
        m = (b >= lo) & (b < hi)
        if m.any():
            print(
                f"  {lo / 1e6:5.0f}-{hi / 1e6:<5.0f} MB: {m.sum():5d} kernels {t[m].sum() * 1e3:7.2f} ms, "
                f"{b[m].sum() / t[m].sum() / 1e9:6.0f} GB/s, {t[m].mean() * 1e6:6.1f} us each"
            )
    costs = memory_costs(mem)  # what a profile takes (--calibrate-here fits the same)
    fixed, bandwidth = costs.all
    print(f"  fit: {fixed * 1e6:.2f} us + bytes / {bandwidth / 1e9:.0f} GB/s")
    for name, (count, seconds, nbytes) in costs.figures.items():
        if not count:
            continue
        fit = "fit -"
        if name in costs.classes:
            fixed, bandwidth = costs.classes[name]
            rate = (
                f"bytes per result / {bandwidth / 1e9:5.2f} GB/s"
                if name == "reduce_few"
                else f"bytes / {bandwidth / 1e9:5.0f} GB/s"
            )
            fit = f"fit {fixed * 1e6:5.2f} us + {rate}"
        print(
            f"  {name:>11}: {count:5d} kernels {seconds * 1e3:7.2f} ms "
            f"{nbytes / 1e9:6.2f} GB, {fit}"
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "pairs",
        nargs="*",
        metavar="TRACE_DIR HLO",
        help="single_device.py's --trace-dir folder of a row and that row's "
        "program (its --hlo-dir file); with more than one row their "
        "memory-bound kernels' class costs are also fitted together "
        "(a profile's memory_kernel_costs)",
    )
    parser.add_argument("--top", type=int, default=10, help="longest kernels to list")
    parser.add_argument(
        "--csv",
        help="write every joined kernel of every row here (.csv or "
        ".csv.gz), to keep and to fit from later",
    )
    parser.add_argument(
        "--from-csv",
        nargs="+",
        default=[],
        metavar="CSV",
        help="instead of traces: the kernels --csv wrote",
    )
    args = parser.parse_args(argv)
    if len(args.pairs) % 2 or not (args.pairs or args.from_csv):
        parser.error("rows come as pairs: TRACE_DIR HLO (or give --from-csv)")
    programs = [p for path in args.from_csv for p in read_csv(path)]
    several = len(programs) + len(args.pairs) // 2 > 1
    for name, device, rows in programs:
        print(f"== {name} (from {', '.join(args.from_csv)})")
        _report(rows, sum(r[4] for r in rows), 1, device, args.top)
    for trace_dir, hlo_path in zip(args.pairs[::2], args.pairs[1::2]):
        rows, total, steps, device = joined(trace_dir, hlo_path)
        name = os.path.basename(os.path.normpath(trace_dir))
        programs.append((name, device, rows))
        if several:
            print(f"== {name}")
        _report(rows, total, steps, device, args.top)
    if len(programs) > 1:
        print(f"== all {len(programs)} rows together")
        _memory_bound([r for _, _, rows in programs for r in rows if not r[1]])
    if args.csv:
        write_csv(args.csv, programs)
    return 0


def _tiles(matrix: list[tuple]) -> None:
    """A GPU's matrix kernels by their fewest rows or features (powers of two), each bucket's
    rate and its share of the widest bucket's: how narrow layers fill the tensor-core tiles
    (a profile's tile_width prices them at n / tile_width)."""
    if not matrix:
        return
    buckets: dict[int, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for r in matrix:
        b = buckets[1 << max(3, math.ceil(math.log2(r[6])))]
        b[0], b[1], b[2] = b[0] + 1, b[1] + r[1], b[2] + r[4]
    widest = max(buckets)
    top = buckets[widest][1] / buckets[widest][2]
    print(
        "  by fewest rows or features (n <=):  "
        + ", ".join(
            f"{n}: {k} at {f / t / 1e12:.0f} TFLOP/s ({f / t / top:.2f})"
            for n, (k, f, t) in sorted(buckets.items())
        )
    )


def _report(rows: list[tuple], total: float, steps: int, device: str, top: int) -> None:
    unjoined = total - sum(r[4] for r in rows)
    print(
        f"{total * 1e3:.2f} ms of {device.upper()} kernels a step ({steps} step(s) traced); "
        f"{unjoined * 1e3:.2f} ms in kernels naming no instruction of the program"
    )
    scale, unit = (1e12, "TFLOP") if device == "gpu" else (1e9, "GFLOP")
    if device == "cpu":
        print("(XLA:CPU runs independent kernels at once: their times overlap)")
    for label, keep in (
        ("matrix", lambda r: r[1] and not r[2]),
        ("thin matrix", lambda r: r[1] and r[2]),
    ):
        sel = [r for r in rows if keep(r)]
        if sel:
            f, t = sum(r[1] for r in sel), sum(r[4] for r in sel)
            print(
                f"{label:>12}: {len(sel):5d} instructions {t * 1e3:8.2f} ms {f / scale:7.3f} {unit} "
                f"{f / t / scale:7.1f} {unit}/s"
            )
    _tiles([r for r in rows if r[1] and not r[2] and r[6]])
    _memory_bound([r for r in rows if not r[1]])
    if top:
        print(f"longest {top}:")
    for name, flops, thin, moved, seconds, *_ in sorted(rows, key=lambda r: -r[4])[:top]:
        rate = (
            f"{flops / seconds / scale:6.1f} {unit}/s"
            if flops
            else f"{moved / seconds / 1e9:6.0f} GB/s   "
        )
        print(f"  {name[:40]:<40} {seconds * 1e6:8.1f} us {rate} {'thin' if thin else ''}")


if __name__ == "__main__":
    raise SystemExit(main())
