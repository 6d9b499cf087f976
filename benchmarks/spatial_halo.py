"""Which mechanism the spatial axis uses: XLA's SPMD partitioner, or halos written by hand.

The same layer two ways on 4 simulated devices, the map split by rows: a 3x3 convolution
(SAME) then a 3x3 stride-2 max-pool (padded), its loss summed, the gradients of the input and
the kernel (the kernel's summed over the bands).

  partitioner  jit with the input and output pinned to (batch, rows over "spatial", ...):
               XLA exchanges the halos (jaxpar/axes/spatial.py's choice)
  ppermute     shard_map: each band receives one row from each neighbour (lax.ppermute),
               pads the map's edges itself, convolves VALID; the pool the same; the gradient
               of a ppermute is the reverse ppermute, the kernel's gradient a psum

It prints both results' agreement, the collective bytes each compiled program moves per
device (exact), and the step time of each (medians of interleaved runs, ratio in one run).

    python benchmarks/spatial_halo.py [--batch 32] [--size 64] [--channels 64] [--repeats 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jaxpar import configfile

configfile.set_host_device_count(4)  # unless XLA_FLAGS already says

import datafile
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar import hlo

AXIS = "spatial"
DN = ("NHWC", "HWIO", "NHWC")


def layer(x, w, conv_pad, pool_pad):
    y = lax.conv_general_dilated(x, w, (1, 1), conv_pad, dimension_numbers=DN)
    y = jax.nn.relu(y)
    return lax.reduce_window(y, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), pool_pad)


def whole_loss(x, w):
    y = layer(x, w, ((1, 1), (1, 1)), ((0, 0), (1, 1), (1, 1), (0, 0)))
    return jnp.sum(y * y)


def partitioner_step(mesh):
    rows = NamedSharding(mesh, P(None, AXIS))

    def loss(x, w):
        x = lax.with_sharding_constraint(x, rows)
        y = lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=DN)
        y = lax.with_sharding_constraint(jax.nn.relu(y), rows)
        y = lax.reduce_window(
            y, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0))
        )
        y = lax.with_sharding_constraint(y, rows)
        return jnp.sum(y * y)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def _halo(x, n, below: int, above: int, fill):
    """x's band with `above` rows from the upper neighbour and `below` from the lower one
    (the map's own edges padded with `fill`)."""
    me = lax.axis_index(AXIS)
    parts = []
    if above:
        got = lax.ppermute(x[:, -above:], AXIS, [(i, i + 1) for i in range(n - 1)])
        parts.append(jnp.where(me == 0, fill, got))
    parts.append(x)
    if below:
        got = lax.ppermute(x[:, :below], AXIS, [(i + 1, i) for i in range(n - 1)])
        parts.append(jnp.where(me == n - 1, fill, got))
    return jnp.concatenate(parts, axis=1)


def ppermute_step(mesh, n):
    def band_loss(x, w):
        x = _halo(x, n, 1, 1, 0.0)  # 3x3 SAME: a row from each side
        y = lax.conv_general_dilated(x, w, (1, 1), ((0, 0), (1, 1)), dimension_numbers=DN)
        y = jax.nn.relu(y)
        # 3x3 stride-2 pool padded by 1: output row r reads rows 2r-1 .. 2r+1; a band of even
        # height needs one row from above only
        y = _halo(y, n, 0, 1, -jnp.inf)
        y = lax.reduce_window(
            y, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (0, 0), (1, 1), (0, 0))
        )
        return jnp.sum(y * y)  # this band's share: differentiated here, summed after

    def step(x, w):
        value, (gx, gw) = jax.value_and_grad(band_loss, argnums=(0, 1))(x, w)
        return lax.psum(value, AXIS), (gx, lax.psum(gw, AXIS))

    fn = jax.shard_map(
        step,
        mesh=mesh,
        in_specs=(P(None, AXIS), P()),
        out_specs=(P(), (P(None, AXIS), P())),
        check_vma=False,
    )
    return jax.jit(fn)


def permute_bytes(fn, *args) -> tuple[int, int]:
    text = fn.lower(*args).compile().as_text()
    found = hlo.collectives(text)
    halo = sum(c.bytes for c in found if c.kind == "collective-permute")
    return halo, sum(c.bytes for c in found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", help="also write the table as data (.csv or .json)")
    args = parser.parse_args()
    n = len(jax.devices())
    mesh = jax.make_mesh((n,), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,))
    key = jax.random.key(0)
    shape = (args.batch, args.size, args.size, args.channels)
    x = jax.random.normal(key, shape)
    w = jax.random.normal(jax.random.fold_in(key, 1), (3, 3, args.channels, args.channels))
    w = w / np.sqrt(9 * args.channels)
    x = jax.device_put(x, NamedSharding(mesh, P(None, AXIS)))
    w = jax.device_put(w, NamedSharding(mesh, P()))
    ref = jax.jit(jax.value_and_grad(whole_loss, argnums=(0, 1)))(np.asarray(x), np.asarray(w))
    steps = {"partitioner": partitioner_step(mesh), "ppermute": ppermute_step(mesh, n)}
    halos = {}
    with jax.set_mesh(mesh):
        for name, fn in steps.items():
            value, (gx, gw) = fn(x, w)
            errs = [
                float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
                for a, b in ((value, ref[0]), (gx, ref[1][0]), (gw, ref[1][1]))
            ]
            halo, total = permute_bytes(fn, x, w)
            halos[name] = (halo, total, max(errs))
            print(
                f"{name:<12} max rel. error vs one device: loss {errs[0]:.1e}, "
                f"d input {errs[1]:.1e}, d kernel {errs[2]:.1e}; per device: "
                f"collective-permute {halo:,} B, all collectives {total:,} B [exact]"
            )
        times = {name: [] for name in steps}
        for _ in range(args.repeats):  # interleaved: both see the same machine
            for name, fn in steps.items():
                t = time.perf_counter()
                jax.block_until_ready(fn(x, w))
                times[name].append(time.perf_counter() - t)
    med = {name: statistics.median(t) for name, t in times.items()}
    for name, t in med.items():
        print(f"{name:<12} step {t * 1e3:.2f} ms (median of {args.repeats}) [clock]")
    print(
        f"ppermute / partitioner step time: {med['ppermute'] / med['partitioner']:.2f} "
        f"[clock, {n} simulated devices on {os.cpu_count()} cores]"
    )
    if args.out:
        rows = [
            {
                "mechanism": name,
                "collective_permute_bytes_per_device": halos[name][0],
                "collective_bytes_per_device": halos[name][1],
                "max_rel_error_vs_one_device": float(f"{halos[name][2]:.1e}"),
                "step_ms_median": round(med[name] * 1e3, 2),
                "step_over_partitioner": round(med[name] / med["partitioner"], 2),
                "devices": n,
                "cores": os.cpu_count(),
            }
            for name in steps
        ]
        datafile.write(args.out, rows)


if __name__ == "__main__":
    main()
