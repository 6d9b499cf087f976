"""What one partitioning of one model costs, read from the programs the trainer runs.

The strategy lists every program of a training step (`Strategy.programs`), lowered and compiled
from abstract arguments (`jax.ShapeDtypeStruct`), so nothing is allocated: full-width VGG16 on
224x224 images compiles in seconds on the simulated CPU devices, whatever the hardware being
predicted. Per program, per device and per call: FLOPs (XLA's cost analysis of the compiled
program), the collectives it performs (kind, mesh axes, bytes, as `--explain` reads them) and
its temporaries; per device stage: the placed state and the stored activations. Every schedule
the trainer runs is a workload here: chunks carry their forward, backward (B) and weight (W)
programs, and the schedule's events say when each runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any

import jax
import ml_collections

from jaxpar import analysis, collectives, models, optim, parallel
from jaxpar import data as data_lib
from jaxpar import mesh as mesh_lib
from jaxpar.errors import ConfigError
from jaxpar.parallel import schedules
from jaxpar.predict.comm import overlap
from jaxpar.predict.kernels import opclass
from jaxpar.predict.programs import gputarget
from jaxpar.run_spec import DEFAULTS, RateRule

# Input shapes of the built-in datasets, so no data is generated or read to predict a row.
_KNOWN_DATA = {
    "shapes10": ((32, 32, 3), 10),
    "digits": ((28, 28, 1), 10),
    "cifar10": ((32, 32, 3), 10),
    "mnist": ((28, 28, 1), 10),
}

# Program roles -> the clock they run on in the predictor's timeline.
PHASE = {
    "train step": "step",
    "forward": "fwd",
    "backward": "bwd",
    "backward input": "bwd",
    "backward weights": "wgt",
    "update": "update",
}


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str
    axes: str  # mesh axes the group varies along, e.g. "data", "tensor", "data+tensor"
    count: int  # per call of its program
    bytes: int  # per device per call, all `count` together
    # bytes per device of each of the `count` collectives (each priced at its own size);
    # () = `count` collectives of bytes / count each
    sizes: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class ChunkCost:
    """One chunk of layers (the whole model without a pipeline), per device and per call."""

    chunk: int
    stage: int  # the device stage that runs it
    flops: dict[str, float]  # by phase ("step", "fwd", "bwd", "wgt", "update")
    collectives: dict[str, tuple[Collective, ...]]  # by phase
    send_bytes: int  # activation sent to the next chunk per micro-batch (0 on the last)
    # by phase: matmul FLOPs, memory-bound bytes and kernels of the compiled programs
    # (opclass); {} = price `flops` as matmul FLOPs alone
    ops: dict[str, opclass.OpClasses] = dataclasses.field(default_factory=dict)
    # by phase: where each collective (element) stands in its program (overlap.windows)
    windows: dict[str, tuple] = dataclasses.field(default_factory=dict)

    def op_classes(self, phase: str) -> opclass.OpClasses:
        """The phase's op classes; `flops` as matmul FLOPs where none were read."""
        found = self.ops.get(phase)
        return found or opclass.OpClasses(matmul_flops=self.flops.get(phase, 0.0))


@dataclasses.dataclass(frozen=True)
class StageCost:
    """One device stage's memory, per device."""

    state_bytes: int  # parameters, optimizer state, batch statistics (+ gradient accumulator)
    temp_bytes: int  # largest temporary of the stage's compiled programs
    stash_bytes: int  # stored activations at the schedule's peak (pipelines)

    @property
    def memory_bytes(self) -> int:
        return self.state_bytes + self.temp_bytes + self.stash_bytes


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    mesh_shape: dict[str, int]
    global_batch: int
    dtype: str
    num_params: int
    param_bytes: int
    flops_per_example: int  # the model's forward FLOPs per image (from its layers)
    schedule: str  # "" without a pipeline
    num_microbatches: int
    events: tuple  # schedules.stage_events, () without a pipeline
    chunks: tuple[ChunkCost, ...]
    stages: tuple[StageCost, ...]
    # the programs read: "XLA:CPU" (simulated CPU devices) or a GPU target's description
    compiled_for: str = "XLA:CPU programs on simulated CPU devices"

    @property
    def num_devices(self) -> int:
        return math.prod(self.mesh_shape.values())

    @property
    def memory_bytes_per_device(self) -> int:
        """The busiest stage's bytes per device, as its compiler allocates them."""
        return max(s.memory_bytes for s in self.stages)

    def stage_flops(self) -> list[float]:
        """FLOPs of one training step per device of each stage (every call of every program)."""
        times = {"step": 1, "update": 1}
        out = [0.0] * len(self.stages)
        for c in self.chunks:
            for phase, flops in c.flops.items():
                out[c.stage] += flops * times.get(phase, self.num_microbatches)
        return out


def input_spec(config: ml_collections.ConfigDict) -> tuple[tuple[int, int, int], int]:
    """(image shape, classes) of the config's dataset, without loading it where it is known."""
    name = config.data.name
    if name == "synthetic":
        return tuple(config.data.image_shape), int(config.data.num_classes)
    if name in _KNOWN_DATA:
        return _KNOWN_DATA[name]

    spec = data_lib.load(config).spec
    return tuple(spec.image_shape), spec.num_classes


def resolve_mesh(config: ml_collections.ConfigDict, num_devices: int) -> dict[str, int]:
    """The mesh a row asks for, {axis: size}; a -1 fills the profile's devices."""
    shape = mesh_lib.shape_of(config, num_devices)
    if -1 in shape.values():
        return shape
    return parallel.validate(config, math.prod(shape.values()))


def _rows(compiled, mesh_shape: dict[str, int]) -> tuple[Collective, ...]:
    rows = collectives.collective_sizes(compiled.as_text(), mesh_shape)
    return tuple(
        Collective(kind, axes, len(sizes), sum(sizes), tuple(sizes))
        for (kind, axes), sizes in sorted(rows.items())
        if axes != "none"
    )


_CACHE: dict[str, Workload] = {}


def workload(
    config: ml_collections.ConfigDict,
    num_devices: int | None = None,
    target: gputarget.Target | None = None,
) -> Workload:
    """Costs of `config` on a mesh of its own size (a -1 takes `num_devices`), compiled for
    `target`'s GPUs without them (gputarget), or on the first devices jax has (simulated CPU
    devices are fine). Cached per config and target."""
    key = f"{config.to_json()} {num_devices} {target}"
    if key not in _CACHE:
        with gputarget.uncached() if target else contextlib.nullcontext():
            _CACHE[key] = _workload(config, num_devices, target)
    return _CACHE[key]


def strategy_for(
    config: ml_collections.ConfigDict, num_devices: int | None = None, devices: list | None = None
):
    """The strategy the trainer would build for `config` (on `devices`, or the first devices
    jax has)."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.sync.impl = "shard_map"  # pmap runs the same collectives; compile one path
    if config.get("strategy", DEFAULTS.strategy) == "pmap":
        config.strategy = "data"
    devices = devices or jax.devices()
    shape = resolve_mesh(config, num_devices or len(devices))
    n = math.prod(shape.values())
    if n > len(devices):
        raise ConfigError(
            f"predicting a {n}-device mesh compiles on {n} devices but there are "
            f"{len(devices)}; set XLA_FLAGS=--xla_force_host_platform_device_count={n}"
        )
    config.mesh_shape = tuple(shape.values())
    image_shape, classes = input_spec(config)
    model = models.build(config.model, image_shape, classes)
    mesh = mesh_lib.make_mesh(shape, devices[:n])
    return parallel.build(config, model, mesh, optim.make_optimizer(RateRule.of_config(config)))


def _workload(
    config: ml_collections.ConfigDict, num_devices: int | None, target: gputarget.Target | None
) -> Workload:
    strategy = strategy_for(config, num_devices, target and target.devices())
    batch = int(config.global_batch_size)
    progs = analysis.programs(strategy, batch)
    sent = strategy.sent_bytes_per_device(batch)
    chunks = []
    for c in sorted({p.chunk for p in progs}):
        mine = [p for p in progs if p.chunk == c]
        flops: dict[str, float] = {}
        cols: dict[str, tuple] = {}
        ops: dict[str, opclass.OpClasses] = {}
        wins: dict[str, tuple] = {}
        for p in mine:
            phase = PHASE[p.role]
            text = p.compiled.as_text()
            classes = opclass.classify(text, "gpu" if target else "cpu")
            # XLA:GPU's compile-only programs have no cost analysis: their FLOPs are the
            # matrix kernels' (what the cost analysis counts bar the elementwise work)
            counted = analysis.program_flops(p.compiled) if not target else classes.flops
            flops[phase] = flops.get(phase, 0.0) + counted
            cols[phase] = cols.get(phase, ()) + _rows(p.compiled, dict(p.mesh.shape))
            ops[phase] = ops.get(phase, opclass.OpClasses()) + classes
            wins[phase] = wins.get(phase, ()) + overlap.windows(text, dict(p.mesh.shape))
        chunks.append(ChunkCost(c, mine[0].stage, flops, cols, sent[c], ops, wins))
    report = analysis.stage_memory(strategy, batch, progs)
    stages = tuple(StageCost(*row) for row in zip(*report))
    model = strategy.model
    return Workload(
        name=model.name,
        mesh_shape=dict(strategy.mesh.shape),
        global_batch=batch,
        dtype=config.model.dtype,
        num_params=model.num_params,
        param_bytes=4 * model.num_params,
        flops_per_example=model.flops_per_example,
        schedule=strategy.schedule or "",
        num_microbatches=strategy.num_microbatches,
        events=tuple(tuple(e) for e in strategy.schedule_events() or ()),
        chunks=tuple(chunks),
        stages=stages,
        compiled_for=target.describe() if target else Workload.compiled_for,
    )


def collective_calls(w: Workload):
    """Every collective of a step as ("kind axes", the collective, its calls per step)."""
    for chunk in w.chunks:
        for phase, cols in chunk.collectives.items():
            times = schedules.calls_per_step(phase, w.num_microbatches)
            for c in cols:
                yield f"{c.kind} {c.axes}", c, times


def describe(w: Workload) -> dict[str, Any]:
    """Per-device bytes of every collective per step, by (kind, axes), for reports."""
    rows: dict[str, int] = {}
    for key, c, times in collective_calls(w):
        rows[key] = max(rows.get(key, 0), c.bytes * times)
    return rows
