"""Hardware profiles: a machine's devices, their peak FLOP/s, memory and per-kernel costs, and
the links between them (links.py: what a collective costs on them), loaded from a profile file
and validated; fitted to its measured runs where it says so (fitting.py). What a program costs
on one is pricing.py's (the Profile's pricing methods call it)."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxpar.errors import ConfigError
from jaxpar.predict import gputarget, opclass, pricing
from jaxpar.predict.links import Link  # a Profile's links


@dataclasses.dataclass(frozen=True)
class Profile:
    """One machine: devices, their compute and memory, and the links between them."""

    name: str
    num_devices: int
    devices_per_node: int
    peak_flops: dict[str, float]  # per device, by compute dtype
    memory_bytes: float  # usable per device
    intra: Link
    inter: Link
    compute_efficiency: float  # matmul FLOP/s achieved over peak (from calibration runs)
    # fraction of the gradient reduction that hides under the backward; None: as the compiled
    # program and its compiler schedule it (jaxpar/predict/overlap.py)
    overlap: float | None = 0.0
    step_overhead_s: float = 0.0  # fixed host/launch time per step
    program_overhead_s: float = 0.0  # per compiled program dispatched (pipelines run many)
    # the pipeline runner's host time per stage (its update, its state) and per micro-batch
    # (slicing the batch, accumulating), per step, and what each further device of a stage adds
    # per stage and per program dispatched (its arguments' buffers): pipelinehost.measure_host
    stage_overhead_s: float = 0.0
    microbatch_overhead_s: float = 0.0
    stage_device_overhead_s: float = 0.0
    program_device_overhead_s: float = 0.0
    # Simulated CPU devices sharing cores: N busy devices together run `pool(N, size)` times
    # one device's rate. A number (min(N, it)), ((N, speedup), ...), or ((N, kernel FLOPs,
    # speedup), ...) measured per size of the programs' matrix kernels (calibrate.py: small
    # kernels leave cores idle that the other devices then use); 0 = devices of their own.
    compute_pool: float | tuple = 0.0
    # Operation classes (jaxpar.predict.opclass): 3x3 stride-1 convolutions at their own
    # fraction of peak (cuDNN's Winograd kernels beat their FLOP count; 0 = compute_efficiency),
    # memory-bound kernels at memory_bandwidth bytes/s (0 = not priced), kernel_s of device
    # time per kernel, launch_s of host time per kernel (a program takes the longer of its
    # device time and its host time: launches overlap execution).
    conv3x3_efficiency: float = 0.0
    memory_bandwidth: float = 0.0
    kernel_s: float = 0.0
    launch_s: float = 0.0
    # How programs are priced: "cpu" or "gpu". On "gpu" with a memory_bandwidth, every matrix
    # kernel is priced on a roofline: the longer of its FLOPs at its class's rate and its bytes
    # at the bandwidth.
    compiler: str = "cpu"
    # The GPU whose own programs are priced (a gputarget.GPUS name): XLA:GPU compiles every
    # program for it on this machine. "" (or where that cannot be done here): the programs
    # compiled for simulated CPU devices.
    gpu: str = ""
    # A matrix kernel whose narrowest GEMM dimension (output rows, output features or products
    # per output) is n runs at n / (n + narrow_width) of its class's rate (0: off): a GPU's
    # tiles are 64-128 wide; a CPU's vector registers hold 8 float32 and its GEMM kernels block
    # several of them (measured here: micro.measure_narrow)
    narrow_width: float = 0.0
    # On "gpu", in its place: a matrix kernel whose fewest of output rows, input features and
    # output features (opclass.Matmul.tile, a convolution's window taps apart) is n runs at
    # min(1, n / tile_width) of its class's rate: tensor-core tiles are tile_width wide, and a
    # narrower layer leaves the rest of each tile idle (0: off). Measured on an H100: a 3x3
    # layer's three kernels at 8 to 256 features run at n / 128 of the wide rate up to 128
    # (here.py's narrow convolutions; DenseNet's 12-feature layers at 0.03-0.08 of peak)
    tile_width: float = 0.0
    # On "gpu": the fraction of peak of a convolution over fewer than 8 channels (an image's
    # first layer and its weight gradient: opclass.Matmul.thin), which tensor-core kernels
    # cannot take (0: as the other convolutions). Measured: 0.045 on an H100 in bfloat16
    # (docs/log.md, "Inside the step")
    thin_efficiency: float = 0.0
    # Each class of memory-bound kernel (opclass.MEMORY_CLASSES: elementwise, reduce,
    # reduce_few, transpose, window; generate on a CPU) at its own {class: (seconds per kernel,
    # bytes/s)}, in place of kernel_s and memory_bandwidth (a class not named keeps those;
    # reduce_few not named is priced as reduce; reduce_few's rate is one result's lane: its
    # bytes per result, OpClasses.lane_bytes, at it). Measured on an H100: a transpose or a
    # pooling window moves its bytes at half the rate of an elementwise kernel, and a reduction
    # into few results about 1.1 GB/s per result (benchmarks/gpu_trace.py prints them from a
    # kernel trace)
    memory_kernel_costs: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    # On "gpu": device time of each matrix kernel beyond kernel_s (cuDNN's and cuBLAS's
    # launch of several kernels, workspace setup, split-K reductions, a last partial wave)
    matmul_kernel_s: float = 0.0
    # On "gpu": convolution kernels measured on this device in measured_dtype (its kernel
    # table, `kernel_benchmarks`: kernels.measured), by layer and view less the batch
    # (opclass.conv_keys without its first element), each timed batch's (N, seconds, Matmul):
    # a step's kernel of a timed batch costs its measured time in place of its priced matrix
    # costs (matmul_kernel_s and its roofline), and of another batch (a data-parallel or
    # pipelined row's share) the nearest timed batch's time scaled by its own price over
    # that kernel's, so that every partitioning of a measured layer is priced alike; kernel_s
    # as any kernel. Set where the profile says `price_measured` (--calibrate-here's, whose
    # table holds its rows' own layers); a table of other layers (DeepBench's, at batches of
    # 8-16) only fits the class rates: scaled to the validated steps' batches of 64 its
    # kernels moved the DGX-1's worst model left out from 20.9% to 22.5% (docs/predict.md)
    measured_kernels: dict[tuple, tuple] = dataclasses.field(default_factory=dict)
    measured_dtype: str = ""
    # A forward-only program (a pipeline chunk's F) runs this many times faster than its op
    # classes priced at these rates, which are a training step's: on XLA:CPU the backward's
    # transposes, reversed kernels and max-pool index tensors cost as much as its
    # convolutions, the forward's do not (measured: micro.measure_forward). A backward
    # that recomputes its forward is a training step's mix, priced as it is. 1.0: as any.
    forward_speedup: float = 1.0
    # Simulated devices that share `shared_cores` cores (this CPU's 8 on 2): a collective
    # inside the step (not the gradient sync) is work on those cores, its payload at
    # `collective_cpu_rate` bytes per CPU-second (cpulinks.measure_collective_cpu), and every
    # device of the mesh does its part on the same cores: bytes x devices / (cores x rate)
    # seconds on top of its link price. 0: devices of their own (every GPU).
    collective_cpu_rate: float = 0.0
    shared_cores: int = 0
    # images/sec the input pipeline delivers per step's host (0: unbounded); the bench measures
    # it for every row (loader_images_per_sec)
    loader_images_per_sec: float = 0.0
    # Inside a node where not every pair of devices is wired directly (NVLink's hybrid cube
    # mesh): the pairs `intra` joins, and the path the others take (`unwired`: through the
    # hosts). A ring runs over its group in rank order, at its slowest hop (links.ring_link;
    # NCCL 1.x builds its one ring so). None: every pair of a node is wired.
    peers: frozenset | None = None
    unwired: Link | None = None
    notes: str = ""
    calibration: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Single-device calibration runs of particular models (`calibrations` in the profile):
    # {model name: run}, and each one's efficiency (fitting.from_config compiles the run's
    # step). A row of such a model computes at that efficiency; other models at
    # compute_efficiency.
    model_runs: dict[str, dict] = dataclasses.field(default_factory=dict)
    model_efficiency: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def target(self) -> gputarget.Target | None:
        """What this profile's programs are compiled for: its GPUs, or None (CPU devices)."""
        return gputarget.target(self.gpu, self.num_devices, self.devices_per_node)

    def shared_core_time(self, nbytes: float, devices: int) -> float:
        """pricing.shared_core_time: the shared cores' seconds for an in-step collective."""
        return pricing.shared_core_time(self, nbytes, devices)

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s per device for `dtype`; the float32 figure for a dtype not listed."""
        return self.peak_flops.get(dtype) or self.peak_flops["float32"]

    def efficiency(self, model: str | None = None) -> float:
        """Achieved over peak: `model`'s own calibration run's if the profile has one (worked
        out as the profile loaded: fitting.from_config), else the profile's
        compute_efficiency."""
        return self.model_efficiency.get(model, self.compute_efficiency)

    def flops_per_s(self, dtype: str, model: str | None = None) -> float:
        """Achieved matmul FLOP/s per device for `dtype` (peak x calibrated efficiency, of
        `model`'s own calibration run where the profile has one)."""
        return self.peak(dtype) * self.efficiency(model)

    def pool(self, n: int, kernel_flops: float | None = None) -> float:
        """pricing.pool: how many times one device's rate n busy devices reach together."""
        return pricing.pool(self, n, kernel_flops)

    def device_time(self, ops: opclass.OpClasses, dtype: str, model: str | None = None) -> float:
        """pricing.device_time: seconds one device runs a program of these op classes."""
        return pricing.device_time(self, ops, dtype, model)

    def host_time(self, ops: opclass.OpClasses) -> float:
        """pricing.host_time: seconds the host spends launching the program's kernels."""
        return pricing.host_time(self, ops)

    def program_time(self, ops: opclass.OpClasses, dtype: str, model: str | None = None) -> float:
        """pricing.program_time: the longer of a program's device time and host time."""
        return pricing.program_time(self, ops, dtype, model)


def from_config(c: Any) -> Profile:
    """A Profile from a profile ConfigDict (or dict), validated, its costs as the file gives
    them (fitting.from_config fits those it says to); see configs/hardware/*.py for the keys."""
    get = c.get if hasattr(c, "get") else (lambda k, d=None: getattr(c, k, d))
    calibration = dict(get("calibration", {}) or {})
    profile = Profile(
        name=str(get("name")),
        num_devices=int(get("num_devices")),
        devices_per_node=int(get("devices_per_node")),
        peak_flops={k: float(v) for k, v in dict(get("peak_flops")).items()},
        memory_bytes=float(get("memory_bytes")),
        intra=Link(**dict(get("intra"))),
        inter=Link(**dict(get("inter") or get("intra"))),
        compute_efficiency=float(get("compute_efficiency", 0.0) or 0.0),
        overlap=None if get("overlap", 0.0) is None else float(get("overlap", 0.0)),
        step_overhead_s=float(get("step_overhead_s", 0.0)),
        program_overhead_s=float(get("program_overhead_s", 0.0)),
        stage_overhead_s=float(get("stage_overhead_s", 0.0)),
        microbatch_overhead_s=float(get("microbatch_overhead_s", 0.0)),
        stage_device_overhead_s=float(get("stage_device_overhead_s", 0.0)),
        program_device_overhead_s=float(get("program_device_overhead_s", 0.0)),
        compute_pool=_pool(get("compute_pool", 0.0)),
        conv3x3_efficiency=float(get("conv3x3_efficiency", 0.0) or 0.0),
        memory_bandwidth=float(get("memory_bandwidth", 0.0) or 0.0),
        kernel_s=float(get("kernel_s", 0.0) or 0.0),
        launch_s=float(get("launch_s", 0.0) or 0.0),
        compiler=str(get("compiler", "cpu")),
        gpu=str(get("gpu", "") or ""),
        loader_images_per_sec=float(get("loader_images_per_sec", 0.0) or 0.0),
        peers=_peers(get("peers"), int(get("devices_per_node"))),
        unwired=Link(**dict(get("unwired"))) if get("unwired") else None,
        narrow_width=float(get("narrow_width", 0.0) or 0.0),
        tile_width=float(get("tile_width", 0.0) or 0.0),
        thin_efficiency=float(get("thin_efficiency", 0.0) or 0.0),
        matmul_kernel_s=float(get("matmul_kernel_s", 0.0) or 0.0),
        memory_kernel_costs=_memory_costs(get("memory_kernel_costs", {}) or {}),
        forward_speedup=float(get("forward_speedup", 1.0) or 1.0),
        collective_cpu_rate=float(get("collective_cpu_rate", 0.0) or 0.0),
        shared_cores=int(get("shared_cores", 0) or 0),
        notes=str(get("notes", "")),
        calibration=calibration,
    )
    if (profile.peers is None) != (profile.unwired is None):
        raise ConfigError(f"profile {profile.name}: peers and unwired go together")
    if profile.overlap is not None and not 0.0 <= profile.overlap <= 1.0:
        raise ConfigError(f"profile {profile.name}: overlap must be in [0, 1] or None")
    if profile.gpu and profile.gpu not in gputarget.GPUS:
        raise ConfigError(f"profile {profile.name}: {gputarget.unavailable(profile.gpu)}")
    if profile.compiler not in ("cpu", "gpu"):
        raise ConfigError(
            f"profile {profile.name}: compiler must be 'cpu' or 'gpu', not {profile.compiler!r}"
        )
    return profile


def _peers(pairs, per_node: int) -> frozenset | None:
    """The wired pairs of a node's devices, each as a sorted pair of local indices."""
    if pairs is None:
        return None
    out = set()
    for pair in pairs:
        a, b = (int(i) for i in pair)
        if not (0 <= a < per_node and 0 <= b < per_node) or a == b:
            raise ConfigError(f"peers: {tuple(pair)} is not a pair of a node's {per_node} devices")
        out.add((min(a, b), max(a, b)))
    return frozenset(out)


def _memory_costs(value) -> dict[str, tuple[float, float]]:
    costs = {str(k): (float(v[0]), float(v[1])) for k, v in dict(value).items()}
    unknown = set(costs) - set(opclass.MEMORY_CLASSES)
    if unknown or any(bw <= 0 or each < 0 for each, bw in costs.values()):
        raise ConfigError(
            f"memory_kernel_costs: classes are {', '.join(opclass.MEMORY_CLASSES)}, "
            f"each (seconds per kernel >= 0, bytes/s > 0); got {dict(value)}"
        )
    return costs


def _pool(value) -> float | tuple:
    if isinstance(value, int | float):
        return float(value)
    points = tuple(tuple(float(x) for x in point) for point in value)
    if any(len(p) not in (2, 3) for p in points):
        raise ConfigError("compute_pool: give (N, speedup) or (N, kernel FLOPs, speedup) points")
    return tuple((int(p[0]), *p[1:]) for p in points)
