"""Pricing a program on a hardware profile: a device's time for a program's op classes (the
matrix kernels on a roofline with their measured kernels where the profile prices XLA:GPU's
programs, at their class's rates with their narrow widths where it prices XLA:CPU's), the host's
launches, the shared cores' pool and collectives. The profile (hardware.Profile) is the data;
these are its prices (Profile's methods of the same names call them)."""

from __future__ import annotations

import itertools
import math
from typing import Any

from jaxpar.predict import opclass

# A hardware.Profile: typed Any so that the arrow runs one way (hardware calls pricing).
Profile = Any


def shared_core_time(profile: Profile, nbytes: float, devices: int) -> float:
    """Seconds the shared cores spend on an in-step collective's `nbytes` per device when
    `devices` devices run it (0 where devices have cores of their own)."""
    if not (profile.collective_cpu_rate and profile.shared_cores):
        return 0.0
    return nbytes * devices / (profile.shared_cores * profile.collective_cpu_rate)


def pool(profile: Profile, n: int, kernel_flops: float | None = None) -> float:
    """How many times one device's rate n busy devices reach together, each running
    programs whose matrix kernels average `kernel_flops` FLOPs. Measured points: linear
    in N from (1, 1.0), linear in log kernel size between measured sizes and flat beyond
    them; without a size, the mean of each N's measured sizes."""
    if not isinstance(profile.compute_pool, tuple):
        return min(float(n), profile.compute_pool) if profile.compute_pool else float(n)
    by_n: dict[int, list[tuple[float, float]]] = {}
    for point in profile.compute_pool:
        size, speedup = (point[1], point[2]) if len(point) == 3 else (1.0, point[1])
        by_n.setdefault(int(point[0]), []).append((float(size), float(speedup)))
    points = [(1, 1.0)] + [
        (k, _along_size(sorted(v), kernel_flops)) for k, v in sorted(by_n.items()) if k > 1
    ]
    for (n0, s0), (n1, s1) in itertools.pairwise(points):
        if n0 <= n <= n1:
            return s0 + (s1 - s0) * (n - n0) / (n1 - n0)
    return points[-1][1]


def device_time(
    profile: Profile, ops: opclass.OpClasses, dtype: str, model: str | None = None
) -> float:
    """Seconds one device runs a program of these op classes (alone on it): every kernel
    costs kernel_s, so a kernel of f FLOPs reaches f / (f + kernel_s x rate) of its class's
    rate (small kernels are slower); memory-bound kernels take their bytes at the
    bandwidth (`memory_time`); matrix kernels their FLOPs at their class's rate, or on a
    roofline (the longer of that and their bytes at the bandwidth) where the profile prices a
    GPU's program with a bandwidth (`gpu_matrix_time`; else `cpu_matrix_time`)."""
    fixed = memory_time(profile, ops)
    if not ops.flops:
        return fixed
    eff = profile.efficiency(model)  # a model's own calibration run scales both classes
    ratio = (
        profile.conv3x3_efficiency / profile.compute_efficiency if profile.conv3x3_efficiency else 1
    )
    peak = profile.peak(dtype) * eff
    if profile.compiler == "gpu" and profile.memory_bandwidth and ops.matmuls:
        return fixed + gpu_matrix_time(profile, ops, dtype, peak, ratio)
    return fixed + cpu_matrix_time(profile, ops, peak, ratio)


def memory_time(profile: Profile, ops: opclass.OpClasses) -> float:
    """Every kernel's fixed time and the memory-bound kernels' bytes: at the bandwidth, or each
    class at its own costs (memory_kernel_costs)."""
    memory = ops.memory_bytes / profile.memory_bandwidth if profile.memory_bandwidth else 0.0
    fixed = memory + ops.kernels * profile.kernel_s
    costs = profile.memory_kernel_costs
    for name, nbytes, kernels in ops.memory_classes if costs else ():
        name = name if name in costs else opclass.CLASS_FALLBACK.get(name, name)
        if name in costs:  # this class at its own costs, not the defaults
            each, bandwidth = costs[name]
            # reduce_few's rate is one lane's: its bytes per result at it
            lane = ops.lane_bytes if name == "reduce_few" else nbytes
            fixed += kernels * (each - profile.kernel_s) + lane / bandwidth
            fixed -= nbytes / profile.memory_bandwidth if profile.memory_bandwidth else 0.0
    return fixed


def gpu_matrix_time(
    profile: Profile, ops: opclass.OpClasses, dtype: str, peak: float, ratio: float
) -> float:
    """XLA:GPU's matrix kernels at `peak` FLOP/s (3x3 ones at `ratio` of it): each on a
    roofline with matmul_kernel_s, at its tile's share (or narrow width's), a thin one at
    thin_efficiency; a kernel of the profile's measured table at its measured time (of the
    nearest timed batch, scaled by its price)."""
    bw, d0, tw = profile.memory_bandwidth, profile.narrow_width, profile.tile_width
    thin = profile.peak(dtype) * profile.thin_efficiency
    share = (lambda m: min(1.0, m.tile / tw)) if tw else (lambda m: m.narrow / (m.narrow + d0))
    table = profile.measured_kernels if dtype == profile.measured_dtype else {}

    def priced(m: opclass.Matmul) -> float:
        return profile.matmul_kernel_s + max(
            m.flops / (thin if m.thin and thin else peak * (ratio if m.winograd else 1) * share(m)),
            m.moved / bw,
        )

    def cost(m: opclass.Matmul) -> float:
        for key in m.keys if table else ():
            timed = table.get(key[1:])
            if timed:  # measured on this device: at its batch, or the nearest
                n, seconds, kernel = min(timed, key=lambda t: abs(math.log(t[0] / key[0])))
                return seconds if n == key[0] else seconds * priced(m) / priced(kernel)
        return priced(m)

    return sum(cost(m) for m in ops.matmuls)


def cpu_matrix_time(profile: Profile, ops: opclass.OpClasses, peak: float, ratio: float) -> float:
    """XLA:CPU's matrix kernels at `peak` FLOP/s (3x3 ones at `ratio` of it), each at its
    narrowest dimension's share where the profile has a narrow_width."""
    if profile.narrow_width and ops.matmuls:  # each matrix kernel at its width's share
        d0 = profile.narrow_width
        return sum(
            m.flops * (m.narrow + d0) / m.narrow / (peak * (ratio if m.winograd else 1))
            for m in ops.matmuls
        )
    return ops.matmul_flops / peak + ops.conv3x3_flops / (peak * ratio)


def host_time(profile: Profile, ops: opclass.OpClasses) -> float:
    """Seconds the host spends launching the program's kernels."""
    return ops.kernels * profile.launch_s


def program_time(
    profile: Profile, ops: opclass.OpClasses, dtype: str, model: str | None = None
) -> float:
    """A program's time: the longer of its device time and its host (launch) time."""
    return max(device_time(profile, ops, dtype, model), host_time(profile, ops))


def _along_size(points: list[tuple[float, float]], size: float | None) -> float:
    """A speedup at kernel size `size` from (size, speedup) points sorted by size: linear in
    log size between them, flat beyond them; None: their mean."""
    if size is None:
        return sum(s for _, s in points) / len(points)
    if size <= points[0][0]:
        return points[0][1]
    for (k0, s0), (k1, s1) in itertools.pairwise(points):
        if size <= k1:
            return s0 + (s1 - s0) * math.log(size / k0) / math.log(k1 / k0)
    return points[-1][1]
