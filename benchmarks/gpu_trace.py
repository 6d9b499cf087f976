"""Where one training step's time goes on a GPU, kernel by kernel: a profiler trace of the step
joined with its compiled program (what docs/predict.md's "Inside the H100's step" is read from).

    XLA_FLAGS=--xla_gpu_enable_command_buffer= python benchmarks/single_device.py \\
        --rows resnet50:224:bfloat16:128 --trace-dir runs/trace --hlo-dir runs/hlo   # on the GPU
    python benchmarks/gpu_trace.py runs/trace/resnet50_224_bfloat16_128 \\
        runs/hlo/resnet50_224_bfloat16_128.hlo.txt.gz                                # anywhere

Without command buffers (the flag above: they cost about 3% here) every kernel of the trace
names the HLO instruction it runs (`hlo_op`), so each kernel's time is joined with that
instruction's FLOPs (convolutions and matrix products, from their shapes) and bytes (its
operands and its result). Prints the matrix kernels (their rate; the thin ones, over fewer
than 8 input channels, apart), the memory-bound kernels (their bandwidth by size, and the
least-squares fit of time = a fixed cost + bytes / bandwidth, for all of them and for each
class: elementwise, reduce, transpose, window, as gpufusion's rule 8 names them) and the
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
import glob
import gzip
import json
import math
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxpar import hlo
from jaxpar.predict import opclass

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.+?)\s([a-z][a-z0-9\-]*)\((.*)$")


def instructions(text: str) -> dict[str, tuple[str, str, str]]:
    """Every instruction of the program: name -> (result type, op, the rest of the line)."""
    return {m.group(1): m.groups()[1:] for m in map(_INSTR.match, text.splitlines()) if m}


def _dims(type_text: str) -> list[int]:
    m = re.search(r"\[([\d,]*)\]", type_text)
    return [int(d) for d in m.group(1).split(",") if d] if m else []


def matrix_flops(result: str, rest: str, ins: dict) -> tuple[float, bool]:
    """(2 x multiply-adds, thin) of a cuDNN convolution or a cuBLAS product; (0, False) else.
    cuDNN's dim_labels are the forward convolution's (input, kernel -> output)."""
    target = re.search(r'custom_call_target="([^"]*)"', rest)
    args = [a for a in opclass._operands(rest) if a in ins]
    if not target or len(args) < 2:
        return 0.0, False
    a, b, out = _dims(ins[args[0]][0]), _dims(ins[args[1]][0]), _dims(result)
    if "cudnn" in target.group(1):
        kind = target.group(1)
        o, f, _x = (
            (b, out, a) if "Filter" in kind else (a, b, out) if "Input" in kind else (out, b, a)
        )
        labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", rest).groups()
        features = f[labels[1].index("i")]
        return 2.0 * math.prod(o) * math.prod(f) / o[labels[2].index("f")], features < opclass.THIN
    if "cublas" in target.group(1) or "gemm" in target.group(1):
        dims = re.search(r'"lhs_contracting_dimensions":\["(\d+)"', rest)
        return 2.0 * math.prod(out) * (a[int(dims.group(1))] if dims else 1), False
    return 0.0, False


def matrix_tile(result: str, rest: str, ins: dict) -> int:
    """A cuDNN convolution's fewest of output rows, input features and output features (a
    cuBLAS product's narrowest dimension): what opclass.Matmul.tile reads from the CPU's
    program, so that a trace shows how a GPU's rate falls with it (Profile.tile_width)."""
    target = re.search(r'custom_call_target="([^"]*)"', rest)
    args = [a for a in opclass._operands(rest) if a in ins]
    if not target or len(args) < 2:
        return 0
    a, b, out = _dims(ins[args[0]][0]), _dims(ins[args[1]][0]), _dims(result)
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", rest)
    if "cudnn" in target.group(1) and labels:
        kind = target.group(1)
        _, w, y = (
            (a, out, b) if "Filter" in kind else (out, b, a) if "Input" in kind else (a, b, out)
        )
        _, kl, ol = labels.groups()
        cin, cout = w[kl.index("i")], w[kl.index("o")]
        return min(math.prod(y) // max(y[ol.index("f")], 1), cin, cout)
    return min(math.prod(out[:-1]) or 1, out[-1] if out else 1, min(a) if a else 1)


def kernel_times(trace_dir: str, top: set[str] = frozenset()) -> tuple[dict[str, float], int, str]:
    """Seconds per step of each HLO instruction's kernels (mean of the trace's steps), and
    the device: a GPU's kernels name their instruction in `hlo_op`; without GPU events, the
    CPU's are the events named after one of the `top` (top-level) instructions."""
    found = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not found:
        raise SystemExit(f"error: no *.trace.json.gz under {trace_dir}")
    events = json.load(gzip.open(found[0]))["traceEvents"]
    gpu = {
        e["pid"]
        for e in events
        if e.get("ph") == "M" and "GPU" in str(e.get("args", {}).get("name"))
    }
    if gpu:
        spans = [(e["args"].get("hlo_op", "?"), e["dur"]) for e in events
                 if e.get("ph") == "X" and e["pid"] in gpu]  # fmt: skip
    else:
        spans = [(e["name"], e["dur"]) for e in events if e.get("ph") == "X" and e["name"] in top]
    per: dict[str, float] = collections.defaultdict(float)
    for name, micros in spans:
        per[name] += micros * 1e-6
    counts = collections.Counter(name for name, _ in spans).values()
    steps = 2 if counts and all(v % 2 == 0 for v in counts) else 1  # single_device.py traces two
    return {k: v / steps for k, v in per.items()}, steps, "gpu" if gpu else "cpu"


def cpu_matrix_flops(name: str, comps: dict, types: dict) -> tuple[float, bool]:
    """(FLOPs, thin) of a CPU program's top-level instruction: a convolution or dot, or a
    fusion holding them; (0, False) else."""
    entry = {n: (result, op, rest) for n, result, op, rest in comps["ENTRY"]}
    result, op, rest = entry[name]
    if op in ("convolution", "dot"):
        found = [(op, result, rest)]
    elif op == "fusion":
        found = [(o, r, rr) for c in opclass._called(rest) for _, r, o, rr in comps.get(c, ())
                 if o in ("convolution", "dot")]  # fmt: skip
    else:
        return 0.0, False
    kernels = [m for o, r, rr in found for m in opclass._matmul(o, r, rr, types).matmuls]
    return sum(m.flops for m in kernels), any(m.thin for m in kernels)


def kernel_class(name: str, comps: dict) -> str:
    """A memory-bound kernel's class (opclass.MEMORY_CLASSES), from what its instruction holds:
    a window (pooling, its gradient, a scatter), a transpose (or a reversal), a reduction, or
    elementwise; what gpufusion's rule 8 names for the modelled program."""
    entry = {n: (op, rest) for n, _, op, rest in comps["ENTRY"]}
    ops, todo = set(), [entry[name]]
    while todo:
        op, rest = todo.pop()
        ops.add(op)
        todo += [(o, r) for c in opclass._called(rest) for _, _, o, r in comps.get(c, ())]
    if ops & {"reduce-window", "select-and-scatter", "scatter"}:
        return "window"
    if ops & {"transpose", "reverse"}:
        return "transpose"
    if "reduce" not in ops:
        return "elementwise"
    _, results, length, row = largest_reduction(name, comps)
    return "reduce" if row or results == 1 else opclass.reduction_class(results, length)


def largest_reduction(name: str, comps: dict) -> tuple[int, int, int, bool]:
    """(elements read, results, elements summed into each, row) of the kernel's largest
    reduction, row when it sums along its operand's minor dimension (XLA:GPU's row
    reduction: a warp or a block per result); (0, 1, 1, False) if it holds none."""
    entry = {n: rest for n, _, _, rest in comps["ENTRY"]}
    best, todo = (0, 1, 1, False), list(opclass._called(entry[name]))
    while todo:
        body = comps.get(todo.pop(), ())
        types = {n: r for n, r, _, _ in body}
        for _, result, op, rest in body:
            todo += opclass._called(rest) if op == "fusion" else []
            args = opclass._operands(rest)
            if op == "reduce" and args and args[0] in types:
                read, results = _elements(types[args[0]]), max(_elements(result), 1)
                layout = re.search(r"\{([\d,]+)\}", types[args[0]].split("]", 1)[-1])
                dims = re.search(r"dimensions=\{([\d,]*)\}", rest)
                minor = layout.group(1).split(",")[0] if layout else None
                row = bool(dims and minor is not None and minor in dims.group(1).split(","))
                best = max(best, (read, results, read // results, row))
    return best


def _elements(type_text: str) -> int:
    """Elements of the first array in a type."""
    return math.prod(_dims(type_text)) if _dims(type_text) else 1


def _fit(b: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Least squares of t = fixed + b / bandwidth with both non-negative: (fixed, bandwidth)."""
    fixed, per_byte = np.linalg.lstsq(np.vstack([np.ones_like(b), b]).T, t, rcond=None)[0]
    if fixed < 0:
        fixed, per_byte = 0.0, float(t.sum() / b.sum())
    elif per_byte <= 0:
        fixed, per_byte = float(t.mean()), 0.0
    return float(fixed), 1 / per_byte if per_byte > 0 else math.inf


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
    fixed, bandwidth = _fit(b, t)
    print(f"  fit: {fixed * 1e6:.2f} us + bytes / {bandwidth / 1e9:.0f} GB/s")
    classes = np.array([r[5] for r in mem])
    lane = b / np.array([r[7] for r in mem])  # a reduce_few kernel's bytes per result
    for name in opclass.MEMORY_CLASSES:
        m = classes == name
        if m.any():
            few = name == "reduce_few"  # priced by one result's lane (Profile.device_time)
            fixed, bandwidth = _fit(lane[m] if few else b[m], t[m])
            rate = f"bytes per result / {bandwidth / 1e9:5.2f} GB/s" if few else \
                f"bytes / {bandwidth / 1e9:5.0f} GB/s"  # fmt: skip
            print(f"  {name:>11}: {m.sum():5d} kernels {t[m].sum() * 1e3:7.2f} ms "
                  f"{b[m].sum() / 1e9:6.2f} GB, fit {fixed * 1e6:5.2f} us + {rate}")  # fmt: skip


def joined(trace_dir: str, hlo_path: str) -> tuple[list[tuple], float, int, str]:
    """Each traced instruction of one row's program: (name, FLOPs, thin, bytes, seconds per
    step, class, tile: a GPU matrix kernel's fewest rows or features, else 0, results: a
    reduce_few kernel's, else 1); with the
    kernels' total seconds per step, the steps traced and the device."""
    with gzip.open(hlo_path, "rt") if hlo_path.endswith(".gz") else open(hlo_path) as f:
        text = f.read()
    ins, comps = instructions(text), opclass._computations(text)
    types = {name: result for body in comps.values() for name, result, _, _ in body}
    times, steps, device = kernel_times(trace_dir, {n for n, *_ in comps.get("ENTRY", ())})
    rows = []
    for name, seconds in times.items():
        if name not in ins:
            continue
        result, op, rest = ins[name]
        tile = 0
        if device == "cpu":
            flops, thin = cpu_matrix_flops(name, comps, types)
        else:
            flops, thin = matrix_flops(result, rest, ins) if op == "custom-call" else (0.0, False)
            tile = matrix_tile(result, rest, ins) if flops else 0
        moved = hlo.shape_bytes(result.split("u8[")[0]) + sum(
            hlo.shape_bytes(ins[a][0]) for a in set(opclass._operands(rest)) if a in ins
        )
        kind = kernel_class(name, comps)
        results = largest_reduction(name, comps)[1] if kind == "reduce_few" else 1
        rows.append((name, flops, thin, float(moved), seconds, kind, tile, results))
    return rows, sum(times.values()), steps, device


COLUMNS = ("program", "device", "name", "flops", "thin", "bytes", "seconds", "class", "tile",
           "results")  # fmt: skip


def write_csv(path: str, programs: list[tuple[str, str, list[tuple]]]) -> None:
    """Every joined kernel of each (program, device, rows) as one line of a CSV (gzip where the
    path ends .gz): the figures a profile's costs are fitted from, small enough to keep beside
    the profile where the traces themselves (hundreds of MB) are not."""
    import csv

    with gzip.open(path, "wt") if path.endswith(".gz") else open(path, "w") as f:
        out = csv.writer(f)
        out.writerow(COLUMNS)
        for program, device, rows in programs:
            for r in rows:
                out.writerow([program, device, r[0], f"{r[1]:.6g}", int(bool(r[2])),
                              f"{r[3]:.6g}", f"{r[4]:.6g}", r[5], r[6], r[7]])  # fmt: skip


def read_csv(path: str) -> list[tuple[str, str, list[tuple]]]:
    """write_csv's programs back: [(program, device, rows as joined() gives them)]."""
    import csv

    programs: dict[tuple[str, str], list[tuple]] = {}
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        for line in csv.DictReader(f):
            programs.setdefault((line["program"], line["device"]), []).append(
                (line["name"], float(line["flops"]), bool(int(line["thin"])),
                 float(line["bytes"]), float(line["seconds"]), line["class"],
                 int(line["tile"]), int(line["results"])))  # fmt: skip
    return [(p, d, rows) for (p, d), rows in programs.items()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pairs", nargs="*", metavar="TRACE_DIR HLO",
                        help="single_device.py's --trace-dir folder of a row and that row's "
                             "program (its --hlo-dir file); with more than one row their "
                             "memory-bound kernels' class costs are also fitted together "
                             "(a profile's memory_kernel_costs)")  # fmt: skip
    parser.add_argument("--top", type=int, default=10, help="longest kernels to list")
    parser.add_argument("--csv", help="write every joined kernel of every row here (.csv or "
                                      ".csv.gz), to keep and to fit from later")  # fmt: skip
    parser.add_argument("--from-csv", nargs="+", default=[], metavar="CSV",
                        help="instead of traces: the kernels --csv wrote")  # fmt: skip
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
    print("  by fewest rows or features (n <=):  " + ", ".join(
        f"{n}: {k} at {f / t / 1e12:.0f} TFLOP/s ({f / t / top:.2f})"
        for n, (k, f, t) in sorted(buckets.items())))  # fmt: skip


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
