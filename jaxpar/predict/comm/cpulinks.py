"""Collectives between simulated CPU devices: what a collective costs on the links between them
(`measure_links`, as nccl-tests measures a GPU's) and on the cores they share
(`measure_collective_cpu`). `python -m jaxpar.predict --calibrate ... --pool` runs both.

Collectives inside the step on cores the devices share (`measure_collective_cpu`). This CPU's
8 simulated devices run on 2 cores, so a collective between a step's layers is work on those
cores: a tensor split's step burns more CPU time a device than a data split's at the same
FLOPs, its cores busier, not idler (`git show 27339c8:docs/predict.md`, "Where the tensor
rows' time goes").
Measured: on all the devices, layers of `x = tanh(conv(all_gather(x)))` (a column-parallel
layer) and of `x = tanh(psum(conv(x)))` (a row-parallel one), each beside the same program
with the collective replaced by local work of the same shape (the gathered copies made
locally; no sum), their process CPU time per call (time.process_time: every thread's); the
payload (each device's result of the collective) over the extra CPU time is the profile's
collective_cpu_rate. The payload, 1 MB a device, is of the size of a tensor split's
collectives in the default suite (their bytes per device over their count in a step's compiled
programs, as jaxpar/collectives.py counts them).
"""

from __future__ import annotations

import dataclasses

from jaxpar.predict.calibrate import micro, timer


def collective_program(kind: str, n: int, batch: int, side: int, channels: int, layers: int):
    """Layers over n devices: "gather" / "copy" (the gathered input made locally), "psum" /
    "local" (no sum); (compiled, args, payload bytes a device a collective)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((n,), ("t",), devices=jax.devices()[:n])
    part = channels // n

    def conv(x, w):
        return jax.lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    def body(x, w):
        for _ in range(layers):
            if kind == "gather":
                x = jnp.tanh(conv(jax.lax.all_gather(x, "t", axis=3, tiled=True), w))
            elif kind == "copy":
                x = jnp.tanh(conv(jnp.concatenate([x * (1.0 + i) for i in range(n)], 3), w))
            elif kind == "psum":
                x = jnp.tanh(jax.lax.psum(conv(x, w), "t"))[..., :part]
            else:
                x = jnp.tanh(conv(x, w) * 2.0)[..., :part]
        return x

    shape = (3, 3, channels, part) if kind in ("gather", "copy") else (3, 3, part, channels)
    spec = P(None, None, None, "t")
    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, P()), out_specs=spec))
    x = jax.device_put(
        jnp.full((batch, side, side, channels), 0.01, jnp.float32), NamedSharding(mesh, spec)
    )
    w = jnp.full(shape, 0.001, jnp.float32)
    return fn.lower(x, w).compile(), (x, w), batch * side * side * channels * 4


def _cpu_seconds(compiled, args, seconds: float) -> float:
    """Process CPU seconds per call (all threads), over at least `seconds` of calls."""
    return timer.measure(lambda: compiled(*args), seconds, min_calls=3).cpu_s


@dataclasses.dataclass(frozen=True)
class CollectiveCpu:
    """Collectives' CPU time on cores the devices share, beyond their local stand-ins."""

    extra: dict[str, float]  # CPU seconds a collective beyond its stand-in, by kind
    payload: int  # bytes a device a collective
    devices: int
    rate: float  # payload bytes per CPU-second, both kinds


def measure_collective_cpu(
    devices: int = 8,
    batch: int = 64,
    side: int = 8,
    channels: int = 64,
    layers: int = 8,
    seconds: float = 2.0,
) -> CollectiveCpu:
    """A column-parallel (gather) and a row-parallel (psum) layer's collectives over up to
    `devices` devices, each beside its local stand-in."""
    import jax

    n = min(devices, jax.device_count())
    extra, payload = {}, 0
    for kind, local in (("gather", "copy"), ("psum", "local")):
        times = {}
        for k in (kind, local):
            compiled, args, payload = collective_program(k, n, batch, side, channels, layers)
            times[k] = _cpu_seconds(compiled, args, seconds)
        extra[kind] = (times[kind] - times[local]) / layers
    spent = sum(extra.values())
    rate = len(extra) * payload * n / spent if spent > 0 else 0.0
    return CollectiveCpu(extra, payload, n, rate)


def collective_cpu_report(m: CollectiveCpu) -> str:
    each = ", ".join(f"{k} {v * 1e3:.2f} CPU-ms" for k, v in m.extra.items())
    return (
        f"collectives inside a step on shared cores ({m.devices} devices, "
        f"{m.payload / 1e6:.2f} MB a device each: {each} beyond local work)\n"
        f"  c.collective_cpu_rate = {m.rate:.3g}"
    )


@dataclasses.dataclass(frozen=True)
class LinkTimes:
    """All-reduces timed between simulated devices and the ring formula fitted to them."""

    allreduce_s: dict[tuple[int, int], float]  # seconds by (N devices, bytes a device)
    latency: float  # seconds a ring step
    bandwidth: float  # bytes/s
    program_s: float  # the host's dispatch of one small program


def measure_links(counts=(2, 4, 8), sizes=(4 << 10, 4 << 20), seconds: float = 1.0) -> LinkTimes:
    """This machine's collective costs between simulated devices, as nccl-tests measures a
    GPU's: the time of one all-reduce (a psum over a shard_map axis) of each per-device size
    over N devices, and the host's cost of dispatching one small program; latency and
    bandwidth fitted to the ring formula (links.ring_allreduce_time) over all (N, bytes)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec

    def timed(fn, *args) -> float:
        return timer.measure(lambda: fn(*args), seconds, min_calls=5).best

    found = {}
    for n in counts:
        mesh = jax.make_mesh((n,), ("x",), devices=jax.devices()[:n])
        body = jax.shard_map(
            lambda a: jax.lax.psum(a, "x"),
            mesh=mesh,
            in_specs=PartitionSpec("x"),
            out_specs=PartitionSpec("x"),
        )
        fn = jax.jit(body)
        for size in sizes:
            x = jax.device_put(
                jnp.ones(n * size // 4, jnp.float32), jax.NamedSharding(mesh, PartitionSpec("x"))
            )
            found[n, size] = timed(fn, x)
    # ring all-reduce: 2(n-1)/n x bytes / bw + 2(n-1) x latency, least squares in (1/bw, lat)
    a = np.array([[2 * (n - 1) / n * b, 2 * (n - 1)] for n, b in found])
    t = np.array(list(found.values()))
    (inv_bw, latency), *_ = np.linalg.lstsq(a / t[:, None], np.ones(len(t)), rcond=None)
    return LinkTimes(found, float(latency), float(1 / inv_bw), micro.measure_dispatch(seconds))


def links_report(links: LinkTimes) -> str:
    lines = ["links between simulated devices (psum over N devices, per-device bytes):"]
    for (n, size), t in links.allreduce_s.items():
        lines.append(f"  N={n} {size:>9,} B: {t * 1e3:.3f} ms")
    lines.append(
        f"  ring fit: latency {links.latency * 1e6:.1f} us per step, bandwidth "
        f"{links.bandwidth / 1e9:.2f} GB/s; one small program dispatched "
        f"{links.program_s * 1e6:.0f} us"
    )
    lines.append(
        f"  c.intra = {{'bandwidth': {links.bandwidth:.3g}, 'latency': "
        f"{links.latency:.3g}, 'rings': 1}}"
    )
    return "\n".join(lines)
