"""What an all-reduce costs inside a step while the other simulated devices compute, against
the CPU profile's ring price (measured with the devices idle).

Run:  python benchmarks/busy_collectives.py [--kernel dot|conv] [--profile configs/hardware/cpu_2core.py]

On N simulated devices (N = 1, 2, 4, 8), one program runs R layers per device, once with a
psum over the N devices after each layer and once without; the difference over R is one
collective's cost under load, beside the profile's price for it (links.collective_time).
- `--kernel dot` (R = 32): `x = tanh(x @ w)`, a small single-threaded matrix kernel of
  2 x B x F x F FLOPs, and a psum of x (B x F float32).
- `--kernel conv` (R = 16): `x = tanh(conv3x3(x))` on B maps of SxSxC, which XLA:CPU runs on
  several threads for milliseconds, and a psum of x's per-channel mean (C float32): the shape
  of a synchronised BatchNorm statistic between VGG's convolutions.
Wall-clock figures [clock]: on 2 shared cores, read them as ratios in one run. Written to test
whether the hybrids' under-prediction on this machine (docs/predict.md, "This machine") came
from collectives inside the step; see there for what it found.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxpar.predict import load_profile
from jaxpar.predict.comm import links

LAYERS = {"dot": 32, "conv": 16}


def median_call(fn, *args, seconds: float) -> float:
    jax.block_until_ready(fn(*args))
    times, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds or len(times) < 5:
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def _conv(x, w):
    return jax.lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def program(kernel: str, n: int, collective: bool):
    mesh = jax.make_mesh((n,), ("x",), devices=jax.devices()[:n])

    def body(x, w):
        for _ in range(LAYERS[kernel]):
            if kernel == "dot":
                x = jnp.tanh(x @ w)
                if collective:
                    x = jax.lax.psum(x, "x") * (1.0 / n)
            else:
                x = jnp.tanh(_conv(x, w))
                if collective:  # a BatchNorm-like statistic over the global batch
                    x = x - jax.lax.psum(jnp.mean(x, axis=(0, 1, 2)), "x") * (1.0 / n)
        return x

    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x")))
    return fn, mesh


def inputs(kernel: str, shape: tuple[int, ...], n: int, mesh):
    if kernel == "dot":
        b, f = shape
        x, w, reduced = jnp.full((n * b, f), 0.01), jnp.eye(f) * 0.5, 4 * b * f
        flops = 2 * b * f * f
    else:
        b, side, c = shape
        x, w = jnp.full((n * b, side, side, c), 0.01), jnp.full((3, 3, c, c), 0.01)
        reduced, flops = 4 * c, 2 * b * side * side * c * c * 9
    x = jax.device_put(x, jax.NamedSharding(mesh, P("x")))
    return x, jax.device_put(w, jax.NamedSharding(mesh, P())), reduced, flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="configs/hardware/cpu_2core.py")
    parser.add_argument("--kernel", choices=tuple(LAYERS), default="conv")
    parser.add_argument(
        "--shapes",
        default=None,
        help="dot: BxF,... (64x256,64x128,32x512); conv: BxSxC,... (16x16x32,32x16x32)",
    )
    parser.add_argument("--seconds", type=float, default=1.5)
    args = parser.parse_args()
    profile = load_profile(args.profile)
    shapes = (
        args.shapes or {"dot": "64x256,64x128,32x512", "conv": "16x16x32,32x16x32"}[args.kernel]
    )
    print(
        "| shape | kernel MFLOP | N | step without [clock] | with psum [clock] | "
        "per psum [clock] | profile's price |"
    )
    print("|---|---|---|---|---|---|---|")
    for text in shapes.split(","):
        shape = tuple(int(v) for v in text.split("x"))
        for n in (1, 2, 4, 8):
            found = {}
            for collective in (False, True):
                fn, mesh = program(args.kernel, n, collective)
                x, w, reduced, flops = inputs(args.kernel, shape, n, mesh)
                found[collective] = median_call(fn, x, w, seconds=args.seconds)
            each = (found[True] - found[False]) / LAYERS[args.kernel]
            price = links.collective_time("all-reduce", reduced, list(range(n)), profile)
            print(
                f"| {text} | {flops / 1e6:.1f} | {n} | {found[False] * 1e3:.2f} ms "
                f"| {found[True] * 1e3:.2f} ms | {each * 1e6:.0f} us | {price * 1e6:.0f} us |",
                flush=True,
            )


if __name__ == "__main__":
    main()
