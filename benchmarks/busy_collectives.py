"""What an all-reduce costs inside a step while the other simulated devices compute, against
the CPU profile's ring price (measured with the devices idle).

Run:  python benchmarks/busy_collectives.py [--profile configs/hardware/cpu_2core.py]

On N simulated devices (N = 1, 2, 4, 8), one program runs R = 32 layers of
`x = tanh(x @ w)` per device (a matrix kernel of 2 x B x F x F FLOPs), once with a psum of x
(B x F float32 per device) over the N devices after each layer and once without. The
difference over R is one collective's cost under load; the profile prices it with its links
(links.collective_time). Wall-clock figures [clock]: on 2 shared cores, read them as ratios in
one run. Written to test whether the hybrids' under-prediction on this machine (docs/predict.md,
"This machine") came from collectives inside the step; see there for what it found.
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

from jaxpar.predict import links, load_profile

LAYERS = 32


def median_call(fn, *args, seconds: float) -> float:
    jax.block_until_ready(fn(*args))
    times, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds or len(times) < 5:
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def program(n: int, collective: bool):
    mesh = jax.make_mesh((n,), ("x",), devices=jax.devices()[:n])

    def body(x, w):
        for _ in range(LAYERS):
            x = jnp.tanh(x @ w)
            if collective:
                x = jax.lax.psum(x, "x") * (1.0 / n)
        return x

    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x")))
    return fn, mesh


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="configs/hardware/cpu_2core.py")
    parser.add_argument("--shapes", default="64x256,64x128,32x512", help="BxF,...")
    parser.add_argument("--seconds", type=float, default=1.5)
    args = parser.parse_args()
    profile = load_profile(args.profile)
    print("| B x F | kernel MFLOP | N | step without [clock] | with psum [clock] | "
          "per psum [clock] | profile's price |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        b, f = (int(v) for v in shape.split("x"))
        for n in (1, 2, 4, 8):
            found = {}
            for collective in (False, True):
                fn, mesh = program(n, collective)
                x = jax.device_put(jnp.full((n * b, f), 0.01), jax.NamedSharding(mesh, P("x")))
                w = jax.device_put(jnp.eye(f) * 0.5, jax.NamedSharding(mesh, P()))
                found[collective] = median_call(fn, x, w, seconds=args.seconds)
            each = (found[True] - found[False]) / LAYERS
            price = links.collective_time("all-reduce", 4 * b * f, list(range(n)), profile)
            print(f"| {b} x {f} | {2 * b * f * f / 1e6:.1f} | {n} | {found[False] * 1e3:.2f} ms "
                  f"| {found[True] * 1e3:.2f} ms | {each * 1e6:.0f} us | {price * 1e6:.0f} us |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
