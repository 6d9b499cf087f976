"""Pricing a program on a hardware profile: a device's time for a program's op classes (the
matrix kernels on a roofline with their measured kernels where the profile prices XLA:GPU's
programs, at their class's rates with their narrow widths where it prices XLA:CPU's), the host's
launches, the shared cores' pool and collectives. The profile (hardware.Profile) is the data;
these are its prices."""

from __future__ import annotations

import itertools
import math

from jaxpar.predict.kernels import opclass
from jaxpar.predict.profiles.hardware import Profile


def peak(profile: Profile, dtype: str) -> float:
    """Peak FLOP/s per device for `dtype`; the float32 figure for a dtype not listed."""
    flops = profile.device.peak_flops
    return flops.get(dtype) or flops["float32"]


def efficiency(profile: Profile, model: str | None = None) -> float:
    """Achieved over peak: `model`'s own calibration run's if the profile has one (worked out
    as the profile loaded: fitting.from_config), else the profile's compute_efficiency."""
    compute = profile.compute
    return compute.model_efficiency.get(model, compute.compute_efficiency)


def flops_per_s(profile: Profile, dtype: str, model: str | None = None) -> float:
    """Achieved matmul FLOP/s per device for `dtype` (peak x calibrated efficiency, of
    `model`'s own calibration run where the profile has one)."""
    return peak(profile, dtype) * efficiency(profile, model)


def shared_core_time(profile: Profile, nbytes: float, devices: int) -> float:
    """Seconds the shared cores spend on an in-step collective's `nbytes` per device when
    `devices` devices run it (0 where devices have cores of their own)."""
    if not (profile.cpu.collective_cpu_rate and profile.cpu.shared_cores):
        return 0.0
    return nbytes * devices / (profile.cpu.shared_cores * profile.cpu.collective_cpu_rate)


def pool(profile: Profile, n: int, kernel_flops: float | None = None) -> float:
    """How many times one device's rate n busy devices reach together, each running
    programs whose matrix kernels average `kernel_flops` FLOPs. Measured points: linear
    in N from (1, 1.0), linear in log kernel size between measured sizes and flat beyond
    them; without a size, the mean of each N's measured sizes."""
    if not isinstance(profile.cpu.compute_pool, tuple):
        return min(float(n), profile.cpu.compute_pool) if profile.cpu.compute_pool else float(n)
    by_n: dict[int, list[tuple[float, float]]] = {}
    for point in profile.cpu.compute_pool:
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
    compute = profile.compute
    ratio = (
        compute.conv3x3_efficiency / compute.compute_efficiency if compute.conv3x3_efficiency else 1
    )
    # a model's own calibration run scales both classes
    rate = peak(profile, dtype) * efficiency(profile, model)
    if profile.device.compiler == "gpu" and profile.memory.memory_bandwidth and ops.matmuls:
        return fixed + gpu_matrix_time(profile, ops, dtype, rate, ratio)
    return fixed + cpu_matrix_time(profile, ops, rate, ratio)


def memory_time(profile: Profile, ops: opclass.OpClasses) -> float:
    """Every kernel's fixed time and the memory-bound kernels' bytes: at the bandwidth, or each
    class at its own costs (memory_kernel_costs)."""
    bandwidth, kernel_s = profile.memory.memory_bandwidth, profile.kernels.kernel_s
    fixed = (ops.memory_bytes / bandwidth if bandwidth else 0.0) + ops.kernels * kernel_s
    costs = profile.memory.memory_kernel_costs
    for name, nbytes, kernels in ops.memory_classes if costs else ():
        name = name if name in costs else opclass.CLASS_FALLBACK.get(name, name)
        if name in costs:  # this class at its own costs, not the defaults
            each, own = costs[name]
            # reduce_few's rate is one lane's: its bytes per result at it
            lane = ops.lane_bytes if name == "reduce_few" else nbytes
            fixed += kernels * (each - kernel_s) + lane / own
            fixed -= nbytes / bandwidth if bandwidth else 0.0
    return fixed


def gpu_matrix_time(
    profile: Profile, ops: opclass.OpClasses, dtype: str, rate: float, ratio: float
) -> float:
    """XLA:GPU's matrix kernels at `rate` FLOP/s (3x3 ones at `ratio` of it): each on a
    roofline with matmul_kernel_s, at its tile's share (or narrow width's), a thin one at
    thin_efficiency; a kernel of the profile's measured table at its measured time (of the
    nearest timed batch, scaled by its price)."""
    compute, kernels = profile.compute, profile.kernels
    bw, d0, tw = profile.memory.memory_bandwidth, compute.narrow_width, compute.tile_width
    thin = peak(profile, dtype) * compute.thin_efficiency
    share = (lambda m: min(1.0, m.tile / tw)) if tw else (lambda m: m.narrow / (m.narrow + d0))
    table = kernels.measured_kernels if dtype == kernels.measured_dtype else {}

    def priced(m: opclass.Matmul) -> float:
        return kernels.matmul_kernel_s + max(
            m.flops / (thin if m.thin and thin else rate * (ratio if m.winograd else 1) * share(m)),
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


def cpu_matrix_time(profile: Profile, ops: opclass.OpClasses, rate: float, ratio: float) -> float:
    """XLA:CPU's matrix kernels at `rate` FLOP/s (3x3 ones at `ratio` of it), each at its
    narrowest dimension's share where the profile has a narrow_width."""
    if profile.compute.narrow_width and ops.matmuls:  # each matrix kernel at its width's share
        d0 = profile.compute.narrow_width
        return sum(
            m.flops * (m.narrow + d0) / m.narrow / (rate * (ratio if m.winograd else 1))
            for m in ops.matmuls
        )
    return ops.matmul_flops / rate + ops.conv3x3_flops / (rate * ratio)


def host_time(profile: Profile, ops: opclass.OpClasses) -> float:
    """Seconds the host spends launching the program's kernels."""
    return ops.kernels * profile.host.launch_s


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
