"""Hardware profiles as data: a machine's devices, compute rates, memory-bound and per-kernel
costs, host times, links and (for simulated CPU devices) shared cores, each a named group,
loaded from a profile file and validated; fitted to its measured runs where it says so
(fitting.py). What a program costs on one is pricing.py's, what a collective costs links.py's,
what its programs are compiled for gputarget.of's."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxpar.errors import ConfigError
from jaxpar.predict.comm.links import Link  # a Profile's links
from jaxpar.predict.kernels import opclass
from jaxpar.predict.profiles.records import CalibrationRun as Run
from jaxpar.predict.programs import gputarget


@dataclasses.dataclass(frozen=True)
class Device:
    """The devices: how many, how they sit in nodes, their peak rates and memory, and what
    compiles their programs."""

    num_devices: int
    devices_per_node: int
    peak_flops: dict[str, float]  # per device, by compute dtype
    memory_bytes: float  # usable per device
    # How programs are priced: "cpu" or "gpu". On "gpu" with a memory_bandwidth, every matrix
    # kernel is priced on a roofline: the longer of its FLOPs at its class's rate and its bytes
    # at the bandwidth.
    compiler: str = "cpu"
    # The GPU whose own programs are priced (a gputarget.GPUS name): XLA:GPU compiles every
    # program for it on this machine. "" (or where that cannot be done here): the programs
    # compiled for simulated CPU devices.
    gpu: str = ""


@dataclasses.dataclass(frozen=True)
class Compute:
    """The matrix kernels' rates: fractions of peak by class and width."""

    compute_efficiency: float = 0.0  # matmul FLOP/s over peak (set or fitted: fitting.py)
    # 3x3 stride-1 convolutions at their own fraction of peak (cuDNN's Winograd kernels beat
    # their FLOP count; 0 = compute_efficiency)
    conv3x3_efficiency: float = 0.0
    # A matrix kernel whose narrowest GEMM dimension (output rows, output features or products
    # per output) is n runs at n / (n + narrow_width) of its class's rate (0: off): a GPU's
    # tiles are 64-128 wide; a CPU's vector registers hold 8 float32 and its GEMM kernels block
    # several of them (measured here: micro.measure_narrow)
    narrow_width: float = 0.0
    # On "gpu", in its place: a matrix kernel whose fewest of output rows, input features and
    # output features (opclass.Matmul.tile) is n runs at min(1, n / tile_width) of its class's
    # rate: a narrower layer leaves the rest of each tensor-core tile idle (0: off)
    tile_width: float = 0.0
    # On "gpu": the fraction of peak of a convolution over fewer than 8 channels (an image's
    # first layer and its weight gradient: opclass.Matmul.thin), which tensor-core kernels
    # cannot take (0: as the other convolutions)
    thin_efficiency: float = 0.0
    # A forward-only program (a pipeline chunk's F) runs this many times faster than its op
    # classes priced at these rates, which are a training step's: on XLA:CPU the backward's
    # transposes, reversed kernels and max-pool index tensors cost as much as its
    # convolutions, the forward's do not (measured: micro.measure_forward). A backward
    # that recomputes its forward is a training step's mix, priced as it is. 1.0: as any.
    forward_speedup: float = 1.0
    # Single-device runs of particular models (`calibrations` in the profile): {model: run},
    # and each one's efficiency (fitting.from_config compiles the run's step). A row of such
    # a model computes at that efficiency; other models at compute_efficiency.
    model_runs: dict[str, Run] = dataclasses.field(default_factory=dict)
    model_efficiency: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class MemoryCosts:
    """The memory-bound kernels' rates (opclass.MEMORY_CLASSES)."""

    # bytes/s of every memory-bound kernel (0 = not priced)
    memory_bandwidth: float = 0.0
    # Each class of memory-bound kernel (elementwise, reduce, reduce_few, transpose, window;
    # generate on a CPU) at its own {class: (seconds per kernel, bytes/s)}, in place of
    # kernel_s and memory_bandwidth (a class not named keeps those; reduce_few not named is
    # priced as reduce; reduce_few's rate is one result's lane: its bytes per result,
    # OpClasses.lane_bytes, at it); benchmarks/gpu_trace.py prints them from a kernel trace
    memory_kernel_costs: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Kernels:
    """What each kernel costs beyond its work, and the kernels measured on the device."""

    kernel_s: float = 0.0  # device time of every kernel
    # On "gpu": device time of each matrix kernel beyond kernel_s (cuDNN's and cuBLAS's
    # launch of several kernels, workspace setup, split-K reductions, a last partial wave)
    matmul_kernel_s: float = 0.0
    # On "gpu": convolution kernels measured on this device in measured_dtype (its kernel
    # table: kernels.measured), by layer and view less the batch (opclass.conv_keys without
    # its first element), each timed batch's (N, seconds, Matmul). A step's kernel costs its
    # measured time (of another batch: the nearest timed batch's, scaled by their prices) in
    # place of its matrix costs. Set where the profile says `price_measured`.
    measured_kernels: dict[tuple, tuple] = dataclasses.field(default_factory=dict)
    measured_dtype: str = ""


@dataclasses.dataclass(frozen=True)
class Host:
    """The host's time: launching kernels (a program takes the longer of its device time and
    its launches), dispatching programs, running the pipeline, feeding the input."""

    launch_s: float = 0.0  # host time per kernel launched
    step_overhead_s: float = 0.0  # fixed host/launch time per step
    program_overhead_s: float = 0.0  # per compiled program dispatched (pipelines run many)
    # the pipeline runner's host time per stage (its update, its state) and per micro-batch
    # (slicing the batch, accumulating), per step, and what each further device of a stage adds
    # per stage and per program dispatched (its arguments' buffers): pipelinehost.measure_host
    stage_overhead_s: float = 0.0
    microbatch_overhead_s: float = 0.0
    stage_device_overhead_s: float = 0.0
    program_device_overhead_s: float = 0.0
    # images/sec the input pipeline delivers per step's host (0: unbounded); the bench measures
    # it for every row (loader_images_per_sec)
    loader_images_per_sec: float = 0.0


@dataclasses.dataclass(frozen=True)
class Links:
    """The links between devices (links.py prices a collective on them)."""

    intra: Link
    inter: Link
    # fraction of the gradient reduction that hides under the backward; None: as the compiled
    # program and its compiler schedule it (jaxpar/predict/comm/overlap.py)
    overlap: float | None = 0.0
    # Inside a node where not every pair of devices is wired directly (NVLink's hybrid cube
    # mesh): the pairs `intra` joins, and the path the others take (`unwired`: through the
    # hosts). A ring runs over its group in rank order, at its slowest hop (links.ring_link;
    # NCCL 1.x builds its one ring so). None: every pair of a node is wired.
    peers: frozenset | None = None
    unwired: Link | None = None


@dataclasses.dataclass(frozen=True)
class SharedCores:
    """Simulated CPU devices that share a CPU's cores (0 everywhere: devices of their own)."""

    # N busy devices together run `pool(N, size)` times one device's rate. A number
    # (min(N, it)), ((N, speedup), ...), or ((N, kernel FLOPs, speedup), ...) measured per size
    # of the programs' matrix kernels (calibrate.py: small kernels leave cores idle that the
    # other devices then use); 0 = devices of their own.
    compute_pool: float | tuple = 0.0
    # A collective inside the step (not the gradient sync) is work on the `shared_cores`
    # cores, its payload at `collective_cpu_rate` bytes per CPU-second
    # (cpulinks.measure_collective_cpu), and every device of the mesh does its part on the same
    # cores: bytes x devices / (cores x rate) seconds on top of its link price.
    collective_cpu_rate: float = 0.0
    shared_cores: int = 0


@dataclasses.dataclass(frozen=True)
class Profile:
    """One machine, as data in named groups; pricing.py says what a program costs on it,
    gputarget.of what its programs are compiled for."""

    name: str
    device: Device
    compute: Compute
    memory: MemoryCosts
    kernels: Kernels
    host: Host
    links: Links
    cpu: SharedCores = SharedCores()
    notes: str = ""
    calibration: Run | None = None  # the one run compute_efficiency is set from


# A Profile's groups; a profile file's keys are the groups' field names, each in one group.
GROUPS = {
    "device": Device,
    "compute": Compute,
    "memory": MemoryCosts,
    "kernels": Kernels,
    "host": Host,
    "links": Links,
    "cpu": SharedCores,
}
GROUP_OF = {f.name: group for group, kind in GROUPS.items() for f in dataclasses.fields(kind)}
# A profile file's plain numbers, each with its value where the file leaves it out.
_NUMBERS = {
    f.name: f.default
    for kind in GROUPS.values()
    for f in dataclasses.fields(kind)
    if f.type == "float" and f.default is not dataclasses.MISSING
}


def build(name: str, notes: str = "", calibration: Run | None = None, **fields: Any) -> Profile:
    """A Profile from its fields by their flat names (a profile file's keys), each put in its
    group; a group's fields not given keep their defaults."""
    parts = _by_group(name, fields)
    groups = {group: kind(**parts.get(group, {})) for group, kind in GROUPS.items()}
    return Profile(name=name, notes=notes, calibration=calibration, **groups)


def replace(profile: Profile, **fields: Any) -> Profile:
    """`profile` with the fields named by their flat names replaced."""
    parts = _by_group(profile.name, fields)
    groups = {g: dataclasses.replace(getattr(profile, g), **v) for g, v in parts.items()}
    return dataclasses.replace(profile, **groups)


def _by_group(name: str, fields: dict[str, Any]) -> dict[str, dict[str, Any]]:
    unknown = set(fields) - set(GROUP_OF)
    if unknown:
        raise ConfigError(f"profile {name}: no field {min(unknown)!r}")
    parts: dict[str, dict[str, Any]] = {}
    for field, value in fields.items():
        parts.setdefault(GROUP_OF[field], {})[field] = value
    return parts


def value(profile: Profile, field: str) -> Any:
    """A field of `profile` by its flat name."""
    return getattr(getattr(profile, GROUP_OF[field]), field)


def fields(profile: Profile) -> dict[str, Any]:
    """Every field of `profile`'s groups by its flat name."""
    return {field: value(profile, field) for field in GROUP_OF}


def from_config(c: Any) -> Profile:
    """A Profile from a profile ConfigDict (or dict), validated, its costs as the file gives
    them (fitting.from_config fits those it says to); see configs/hardware/*.py for the keys."""
    get = c.get if hasattr(c, "get") else (lambda k, d=None: getattr(c, k, d))
    numbers = {name: float(get(name, start) or start) for name, start in _NUMBERS.items()}
    per_node = int(get("devices_per_node"))
    profile = build(
        str(get("name")),
        num_devices=int(get("num_devices")),
        devices_per_node=per_node,
        peak_flops={k: float(v) for k, v in dict(get("peak_flops")).items()},
        memory_bytes=float(get("memory_bytes")),
        compiler=str(get("compiler", "cpu")),
        gpu=str(get("gpu", "") or ""),
        intra=Link(**dict(get("intra"))),
        inter=Link(**dict(get("inter") or get("intra"))),
        overlap=None if get("overlap", 0.0) is None else float(get("overlap", 0.0)),
        peers=_peers(get("peers"), per_node),
        unwired=Link(**dict(get("unwired"))) if get("unwired") else None,
        memory_kernel_costs=_memory_costs(get("memory_kernel_costs", {}) or {}),
        compute_pool=_pool(get("compute_pool", 0.0)),
        shared_cores=int(get("shared_cores", 0) or 0),
        notes=str(get("notes", "")),
        calibration=Run.of_record(get("calibration")) if get("calibration") else None,
        **numbers,
    )
    links, device = profile.links, profile.device
    if (links.peers is None) != (links.unwired is None):
        raise ConfigError(f"profile {profile.name}: peers and unwired go together")
    if links.overlap is not None and not 0.0 <= links.overlap <= 1.0:
        raise ConfigError(f"profile {profile.name}: overlap must be in [0, 1] or None")
    if device.gpu and device.gpu not in gputarget.GPUS:
        raise ConfigError(f"profile {profile.name}: {gputarget.unavailable(device.gpu)}")
    if device.compiler not in ("cpu", "gpu"):
        raise ConfigError(
            f"profile {profile.name}: compiler must be 'cpu' or 'gpu', not {device.compiler!r}"
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
