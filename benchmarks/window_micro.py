"""What a pooling window costs on a GPU, by its size, stride and map: the next measurement
issue 36's predictor needed after reductions: in an H100's traces Inception-v3's window
kernels (3x3 stride-1 average pools among them) moved their bytes slower than VGG's 2x2
stride-2 max pools, where a profile prices every window kernel at one rate (`git show
27339c8:docs/predict.md`, "Reductions into few results").

    XLA_FLAGS=--xla_gpu_enable_command_buffer= python benchmarks/window_micro.py --out runs/window.json

Each case (pool, window, stride, batch, side, features) is one pooling layer's forward and its
gradient in one jitted program, called a few times under JAX's profiler; the trace's kernels
(benchmarks/reduce_micro.py reads them the same way) give its kernels per call, their device
time, and that time split between the window kernels (reduce-window, select-and-scatter,
scatter: opclass.memory_class's window class) and the rest. Printed per case: kernels, microseconds, the
window kernels' share, the bytes the layer must move (input and output, forward and gradient)
and the rate. On a CPU it runs too (--small: a smoke test).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_spec = importlib.util.spec_from_file_location(
    "reduce_micro", os.path.join(os.path.dirname(os.path.abspath(__file__)), "reduce_micro.py")
)
reduce_micro = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reduce_micro)

# pool, window, stride: VGG's and AlexNet's max pools, ResNet-50's, Inception-v3's average
# pools (3x3 stride 1, "SAME") and its stride-2 reductions; on the maps they run on
CASES = [("max", 2, 2), ("max", 3, 2), ("avg", 3, 1), ("avg", 3, 2)]
MAPS = [(64, 112, 64), (64, 56, 128), (64, 35, 288), (64, 17, 768), (64, 8, 1280)]
SMALL_MAPS = [(2, 8, 8), (2, 6, 16)]


def measure(
    pool: str,
    window: int,
    stride: int,
    batch: int,
    side: int,
    features: int,
    dtype: str,
    calls: int = 5,
) -> dict:
    """One case's forward and gradient program, traced over `calls` calls."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    from jaxpar import hlo

    x = jax.device_put(jnp.ones((batch, side, side, features), dtype))
    dims, strides = (1, window, window, 1), (1, stride, stride, 1)

    def layer(x):
        if pool == "max":
            return lax.reduce_window(x, -jnp.inf, lax.max, dims, strides, "SAME")
        return lax.reduce_window(x, 0.0, lax.add, dims, strides, "SAME") / (window * window)

    def step(x):
        y, vjp = jax.vjp(layer, x)
        return y, vjp(jnp.ones_like(y))[0]

    fn = jax.jit(step)
    compiled = fn.lower(x).compile()
    program = hlo.parse(compiled.as_text())
    entry = {ins.name: ins for ins in program.entry}
    window_ops = {"reduce-window", "select-and-scatter", "scatter"}

    def is_window(name: str) -> bool:
        """An entry instruction that is, or calls, a window operation."""
        ops, todo = set(), [entry[name]] if name in entry else []
        while todo:
            ins = todo.pop()
            ops.add(ins.opcode)
            todo += [inner for c in ins.callees for inner in program.body(c)]
        return bool(ops & window_ops)

    for _ in range(3):
        jax.block_until_ready(fn(x))
    with tempfile.TemporaryDirectory() as where:
        with jax.profiler.trace(where, create_perfetto_trace=True):
            for _ in range(calls):
                out = fn(x)
            jax.block_until_ready(out)
        events, device = reduce_micro._gpu_events(where)
    if device == "cpu":  # XLA:CPU's events named after the program's top-level instructions
        events = [(n, t) for n, t in events if n in entry]
    per = collections.Counter(n for n, _ in events)
    seconds = sum(t for _, t in events) / calls
    in_window = sum(t for n, t in events if is_window(n)) / calls
    out_side = -(-side // stride)
    y_bytes = batch * out_side * out_side * features * x.dtype.itemsize
    return {
        "pool": pool,
        "window": window,
        "stride": stride,
        "batch": batch,
        "side": side,
        "features": features,
        "dtype": dtype,
        "device": device,
        "kernels": sum(per.values()) / calls,
        "seconds": seconds,
        "window_seconds": in_window,
        "bytes": float(2 * x.nbytes + 2 * y_bytes),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write every row here (JSON)")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--small", action="store_true", help="two tiny maps (a smoke test)")
    args = parser.parse_args(argv)
    rows = []
    print(
        f"{'dtype':>9} {'pool':>4} {'win':>3} {'str':>3} {'batch':>5} {'side':>4} {'feat':>5} "
        f"{'kernels':>7} {'us':>8} {'window':>6} {'MB':>8} {'TB/s':>6}"
    )
    for dtype in args.dtypes.split(","):
        for pool, window, stride in CASES:
            for b, s, c in SMALL_MAPS if args.small else MAPS:
                r = measure(pool, window, stride, b, s, c, dtype)
                rows.append(r)
                share = r["window_seconds"] / max(r["seconds"], 1e-12)
                print(
                    f"{dtype:>9} {pool:>4} {window:3d} {stride:3d} {b:5d} {s:4d} {c:5d} "
                    f"{r['kernels']:7.1f} {r['seconds'] * 1e6:8.1f} {share:6.2f} "
                    f"{r['bytes'] / 1e6:8.2f} "
                    f"{r['bytes'] / max(r['seconds'], 1e-12) / 1e12:6.2f}",
                    flush=True,
                )
    for pool, window, stride in CASES:
        mine = [r for r in rows if (r["pool"], r["window"], r["stride"]) == (pool, window, stride)]
        found = reduce_micro.fit(mine)
        if found:
            fixed, bw = found
            print(
                f"{pool} {window}x{window} stride {stride}: {fixed * 1e6:.2f} us + bytes / "
                f"{bw / 1e12:.2f} TB/s ({len(mine)} maps)"
            )
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
