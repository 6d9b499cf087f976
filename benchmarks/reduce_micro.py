"""What one reduction costs on a GPU, by how long it is and how many results it has: the next
thing issue 36's predictor needed measured: fitted row by row, a reduction costs another fixed
time and bandwidth in each model's program, where a profile once priced every one alike
(`git show 27339c8:docs/predict.md`, "Narrow layers on a GPU").

    XLA_FLAGS=--xla_gpu_enable_command_buffer= python benchmarks/reduce_micro.py --out runs/reduce.json

Each shape (batch, side, features) is a BatchNorm's statistics, the sum and the sum of squares
of an NHWC activation over batch x side x side: one jitted program, called a few times under
JAX's profiler; the trace's kernels (benchmarks/gpu_trace.py reads them the same way) give the
program's kernels per call and their device time, so the dispatch of a small program does not
count. Printed per shape: the length summed into each result (batch x side x side), the
results (features), kernels per call (XLA:GPU splits a long reduction),
microseconds, bytes read and the rate; then `fixed + bytes / bandwidth` fitted to the shapes
run as one kernel and to the others apart, and `fixed + bytes per result / lane rate` to the
one-kernel shapes of fewer than 1,024 results (opclass's reduce_few class). On a CPU it runs too (--small: a smoke test; XLA:CPU
runs the two sums as two kernels).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# batch, side, features: the maps of the models whose reductions the traces priced apart
# (VGG19 and ResNet-20 at 32x32, DenseNet-40's 12-feature growth, Inception-v3's 35/17/8 maps,
# ResNet-50's 56/28/14/7)
SHAPES = [(128, s, c) for s in (4, 8, 17, 32, 35, 56) for c in (12, 64, 148, 288, 512)]
# and 4,096 rows (a batch of 64 over 8x8 maps: run whole) into 96 to 2,048 results, across
# opclass's reduce_few (fewer than 1,024 results: one lane each, time set by bytes per result)
SHAPES += [(64, 8, c) for c in (96, 192, 384, 768, 1024, 1536, 2048)]
SMALL = [(2, 4, 8), (2, 8, 16), (4, 8, 12)]


def _gpu_events(trace_dir: str) -> tuple[list[tuple[str, float]], str]:
    """(name, seconds) of every kernel in the trace: a GPU's, or a CPU's named events."""
    (path,) = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)[:1]
    events = json.load(gzip.open(path))["traceEvents"]
    gpu = {
        e["pid"]
        for e in events
        if e.get("ph") == "M" and "GPU" in str(e.get("args", {}).get("name"))
    }
    if gpu:
        return [
            (e["args"].get("hlo_op", "?"), e["dur"] * 1e-6)
            for e in events
            if e.get("ph") == "X" and e["pid"] in gpu
        ], "gpu"
    return [(e["name"], e["dur"] * 1e-6) for e in events if e.get("ph") == "X"], "cpu"


def measure(batch: int, side: int, features: int, dtype: str, calls: int = 5) -> dict:
    """One shape's statistics program, traced over `calls` calls."""
    import jax
    import jax.numpy as jnp

    from jaxpar import hlo

    x = jax.device_put(jnp.ones((batch, side, side, features), dtype))

    def stats(x):
        f = x.astype(jnp.float32)
        return jnp.sum(f, axis=(0, 1, 2)), jnp.sum(f * f, axis=(0, 1, 2))

    fn = jax.jit(stats)
    compiled = fn.lower(x).compile()
    entry = {ins.name for ins in hlo.parse(compiled.as_text()).entry}
    for _ in range(3):
        jax.block_until_ready(fn(x))
    with tempfile.TemporaryDirectory() as where:
        with jax.profiler.trace(where, create_perfetto_trace=True):
            for _ in range(calls):
                out = fn(x)
            jax.block_until_ready(out)
        events, device = _gpu_events(where)
    if device == "cpu":  # XLA:CPU's events named after the program's top-level instructions
        events = [(n, t) for n, t in events if n in entry]
    per = collections.Counter(n for n, _ in events)
    seconds = sum(t for _, t in events) / calls
    return {
        "batch": batch,
        "side": side,
        "features": features,
        "dtype": dtype,
        "length": batch * side * side,
        "results": features,
        "device": device,
        "kernels": sum(per.values()) / calls,
        "seconds": seconds,
        "bytes": float(x.nbytes + 2 * 4 * features),
    }


def fit(rows: list[dict]) -> tuple[float, float] | None:
    """Least squares of seconds = fixed + bytes / bandwidth: (fixed s, bandwidth B/s)."""
    if len(rows) < 2:
        return None
    a = np.array([[1.0, r["bytes"]] for r in rows])
    t = np.array([r["seconds"] for r in rows])
    (fixed, per_byte), *_ = np.linalg.lstsq(a, t, rcond=None)
    return float(fixed), float(1 / per_byte) if per_byte > 0 else float("inf")


def fit_lanes(rows: list[dict]) -> tuple[float, float] | None:
    """Least squares of seconds = fixed + bytes per result / lane rate (opclass's reduce_few):
    (fixed s, one result's B/s)."""
    if len(rows) < 2:
        return None
    a = np.array([[1.0, r["bytes"] / r["results"]] for r in rows])
    t = np.array([r["seconds"] for r in rows])
    (fixed, per_byte), *_ = np.linalg.lstsq(a, t, rcond=None)
    return float(fixed), float(1 / per_byte) if per_byte > 0 else float("inf")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write every row here (JSON)")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--small", action="store_true", help="three tiny shapes (a smoke test)")
    args = parser.parse_args(argv)
    rows = []
    print(
        f"{'dtype':>9} {'batch':>5} {'side':>4} {'feat':>5} {'length':>7} {'kernels':>7} "
        f"{'us':>8} {'MB':>8} {'TB/s':>6}"
    )
    for dtype in args.dtypes.split(","):
        for b, s, c in SMALL if args.small else SHAPES:
            r = measure(b, s, c, dtype)
            rows.append(r)
            print(
                f"{dtype:>9} {b:5d} {s:4d} {c:5d} {r['length']:7d} {r['kernels']:7.1f} "
                f"{r['seconds'] * 1e6:8.1f} {r['bytes'] / 1e6:8.2f} "
                f"{r['bytes'] / max(r['seconds'], 1e-12) / 1e12:6.2f}",
                flush=True,
            )
    for label, keep in (
        ("one kernel", lambda r: r["kernels"] <= 1.5),
        ("several (split, or not fused)", lambda r: r["kernels"] > 1.5),
    ):
        found = fit([r for r in rows if keep(r)])
        if found:
            fixed, bw = found
            print(
                f"{label}: {fixed * 1e6:.2f} us + bytes / {bw / 1e12:.2f} TB/s "
                f"({sum(map(keep, rows))} shapes)"
            )
    from jaxpar.predict.kernels import opclass

    few = [
        r
        for r in rows
        if r["kernels"] <= 1.5
        and opclass.reduction_class(r["results"], r["length"]) == "reduce_few"
    ]
    found = fit_lanes(few)
    if found:
        fixed, lane = found
        print(
            f"one kernel into fewer than {opclass.FEW_RESULTS} results (reduce_few): "
            f"{fixed * 1e6:.2f} us + bytes per result / {lane / 1e9:.2f} GB/s "
            f"({len(few)} shapes; a profile's memory_kernel_costs['reduce_few'])"
        )
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
