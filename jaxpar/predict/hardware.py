"""Hardware profiles and what collectives cost on them.

A profile (`configs/hardware/*.py`, `get_config()`) describes one machine or cluster: devices,
their peak FLOP/s, memory, and the links between them. The cost formulas are the textbook
ones (bandwidth-optimal rings, Thakur et al. 2005; NCCL's "bus bandwidth" convention):

  all-reduce      2(n-1)/n x bytes / bw + 2(n-1) x latency
  all-gather      (n-1)/n x result bytes / bw + (n-1) x latency
  reduce-scatter  (n-1) x result bytes / bw + (n-1) x latency   (result = 1/n of the input)
  all-to-all      (n-1)/n x bytes / bw + (n-1) x latency
  point-to-point  bytes / bw + latency                          (collective-permute, stages)

`bw` is per device and direction: the link bandwidth times the number of rings the
collective library builds. A group that spans nodes is reduced hierarchically: reduce-scatter
inside each node, all-reduce of the 1/g share across nodes (each device over its own NIC),
all-gather inside the node. Devices are numbered in mesh order, (data, stage, tensor) row-major,
and device i sits on node i // devices_per_node.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from jaxpar import configfile
from jaxpar.errors import ConfigError
from jaxpar.predict import workload


@dataclasses.dataclass(frozen=True)
class Link:
    bandwidth: float  # bytes/s per device per direction, as one ring of the library sees it
    latency: float  # seconds per ring step (one message)
    rings: int = 1  # rings the collective library runs at once over these links

    @property
    def ring_bandwidth(self) -> float:
        return self.bandwidth * self.rings


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
    compute_efficiency: float  # achieved model FLOP/s over peak (from a calibration run)
    overlap: float = 0.0  # fraction of gradient all-reduce time hidden under the backward
    step_overhead_s: float = 0.0  # fixed host/launch time per step
    program_overhead_s: float = 0.0  # per compiled program dispatched (pipelines run many)
    compute_pool: int = 0  # >0: all devices share the compute of this many (simulated CPU)
    notes: str = ""
    calibration: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Single-device calibration runs of particular models (`calibrations` in the profile):
    # {model name: run}. A row of such a model computes at that run's efficiency (worked out
    # when first needed: it compiles the run's step); other models at compute_efficiency.
    model_runs: dict[str, dict] = dataclasses.field(default_factory=dict)

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s per device for `dtype`; the float32 figure for a dtype not listed."""
        return self.peak_flops.get(dtype) or self.peak_flops["float32"]

    def efficiency(self, model: str | None = None) -> float:
        """Achieved over peak: `model`'s own calibration run's if the profile has one, else the
        profile's compute_efficiency."""
        run = self.model_runs.get(model)
        if run is None:
            return self.compute_efficiency
        key = (self.peak(run.get("dtype", "float32")), self.step_overhead_s,
               self.program_overhead_s, repr(sorted(run.items())))  # fmt: skip
        if key not in _EFFICIENCY:
            _EFFICIENCY[key] = calibrate(self, run).compute_efficiency
        return _EFFICIENCY[key]

    def flops_per_s(self, dtype: str, model: str | None = None) -> float:
        """Achieved model FLOP/s per device for `dtype` (peak x calibrated efficiency, of
        `model`'s own calibration run where the profile has one)."""
        return self.peak(dtype) * self.efficiency(model)


_EFFICIENCY: dict[tuple, float] = {}  # calibrations worked out so far (each compiles a step)


def load_profile(path: str | Path) -> Profile:
    """Load a profile config file (`get_config()` -> ConfigDict); calibrate it if it says how."""
    path = Path(path)
    if not path.is_file():
        shipped = Path(configfile.ROOT, "configs", "hardware").glob("*.py")
        known = sorted(p.name for p in shipped if p.stem[0] != "_")
        raise ConfigError(f"no hardware profile {str(path)!r}; choose one of {', '.join(known)}")
    return from_config(configfile.load(str(path)))


def from_config(c: Any) -> Profile:
    """A Profile from a profile ConfigDict (or dict); see configs/hardware/*.py for the keys."""
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
        overlap=float(get("overlap", 0.0)),
        step_overhead_s=float(get("step_overhead_s", 0.0)),
        program_overhead_s=float(get("program_overhead_s", 0.0)),
        compute_pool=int(get("compute_pool", 0)),
        notes=str(get("notes", "")),
        calibration=calibration,
    )
    if not 0.0 <= profile.overlap <= 1.0:
        raise ConfigError(f"profile {profile.name}: overlap must be in [0, 1]")
    if calibration:
        profile = calibrate(profile, calibration)
    runs = {str(r["model"]): dict(r) for r in get("calibrations", ()) or ()}
    profile = dataclasses.replace(profile, model_runs=runs)
    if profile.compute_efficiency <= 0:
        raise ConfigError(f"profile {profile.name}: set compute_efficiency or a calibration run")
    return profile


def calibrate(profile: Profile, run: dict[str, Any]) -> Profile:
    """Set compute efficiency from one measured single-device run: images/sec of a named model
    at a batch size. efficiency = FLOPs of that step / step time / peak, after taking the
    profile's fixed overheads out of the step time. The FLOPs are the compiled single-device
    step's own (XLA's cost analysis, as the predictor counts every program), so a prediction
    of the calibration run itself gives back the measured images/sec."""
    batch = int(run["batch_size"])
    step = (
        batch / float(run["images_per_sec"]) - profile.step_overhead_s - profile.program_overhead_s
    )
    flops = workload.calibration_flops(run)
    peak = profile.peak(run.get("dtype", "float32"))
    return dataclasses.replace(profile, compute_efficiency=flops / step / peak)


# -- collectives --------------------------------------------------------------------------


def ring_allreduce_time(nbytes: float, n: int, link: Link) -> float:
    """Bandwidth-optimal ring all-reduce of `nbytes` over n devices."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / link.ring_bandwidth + 2 * (n - 1) * link.latency


def allgather_time(result_bytes: float, n: int, link: Link) -> float:
    if n <= 1:
        return 0.0
    return (n - 1) / n * result_bytes / link.ring_bandwidth + (n - 1) * link.latency


def reduce_scatter_time(result_bytes: float, n: int, link: Link) -> float:
    if n <= 1:
        return 0.0
    return (n - 1) * result_bytes / link.ring_bandwidth + (n - 1) * link.latency


def p2p_time(nbytes: float, link: Link) -> float:
    return nbytes / link.bandwidth + link.latency if nbytes else 0.0


def group_of(axes: str, mesh_shape: dict[str, int]) -> list[int]:
    """Device indices of the group containing device 0 that varies along `axes` ("data+tensor")."""
    names, sizes = list(mesh_shape), list(mesh_shape.values())
    chosen = set(axes.split("+"))
    ranges = [range(s) if n in chosen else range(1) for n, s in zip(names, sizes)]
    ids = np.arange(math.prod(sizes)).reshape(sizes)
    return sorted(int(i) for i in ids[np.ix_(*ranges)].ravel())


def span(group: list[int], devices_per_node: int) -> tuple[int, int]:
    """(devices per node in the group, nodes the group spans)."""
    nodes = len({i // devices_per_node for i in group})
    return len(group) // nodes, nodes


def collective_time(kind: str, nbytes: float, group: list[int], profile: Profile) -> float:
    """Seconds for one collective of `kind` whose result is `nbytes` per device over `group`."""
    n = len(group)
    if n <= 1 or nbytes == 0:
        return 0.0
    local, nodes = span(group, profile.devices_per_node)
    if kind == "all-reduce":
        if nodes == 1:
            return ring_allreduce_time(nbytes, n, profile.intra)
        # hierarchical: reduce-scatter in the node, all-reduce of 1/local across, all-gather
        inside = reduce_scatter_time(nbytes / local, local, profile.intra) + allgather_time(
            nbytes, local, profile.intra
        )
        return inside + ring_allreduce_time(nbytes / local, nodes, profile.inter)
    link = profile.intra if nodes == 1 else profile.inter  # flat ring, slowest link rules
    if kind == "all-gather":
        return allgather_time(nbytes, n, link)
    if kind == "reduce-scatter":
        return reduce_scatter_time(nbytes, n, link)
    if kind == "all-to-all":
        return allgather_time(nbytes, n, link)
    return p2p_time(nbytes, link)  # collective-permute


def transfer_link(src: int, dst: int, profile: Profile) -> Link:
    """The link a point-to-point transfer between two devices uses."""
    same = src // profile.devices_per_node == dst // profile.devices_per_node
    return profile.intra if same else profile.inter
