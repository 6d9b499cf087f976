"""What one partitioning of one model costs, read from jaxpar itself: exact, device-free.

Per stage (one stage unless the mesh has a pipeline): forward FLOPs per example per device
(layer by layer, divided by the tensor axis where the layer's kernel is split), the collectives
each compiled program performs (kind, mesh axes, bytes per device per call, as `--explain`
reads them), per-device state bytes, the compiled programs' temporaries, stored pipeline inputs
and the activation sent to the next stage. The step is lowered and compiled with abstract
inputs (`jax.ShapeDtypeStruct`), so nothing is allocated: full-width VGG16 on 224x224 images
compiles in seconds on the simulated CPU devices, whatever the hardware being predicted.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from jaxpar import analysis, models, optim, parallel
from jaxpar import config as config_lib
from jaxpar import mesh as mesh_lib
from jaxpar.config import ConfigError
from jaxpar.parallel import schedules, tensor

# Input shapes of the built-in datasets, so no data is generated or read to predict a row.
_KNOWN_DATA = {
    "shapes10": ((32, 32, 3), 10),
    "cifar10": ((32, 32, 3), 10),
    "mnist": ((28, 28, 1), 10),
}


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str
    axes: str  # mesh axes the group varies along, e.g. "data", "tensor", "data+tensor"
    count: int  # per call of its program
    bytes: int  # per device per call, all `count` together


@dataclasses.dataclass(frozen=True)
class StageCost:
    """One pipeline stage (or the whole step when there is no pipeline), per device."""

    bounds: tuple[int, int]  # layers [a, b)
    fwd_flops_per_example: float  # forward FLOPs per example on one device of the stage
    collectives: dict[str, tuple[Collective, ...]]  # program ("step", "fwd", "bwd", "update")
    state_bytes: int  # parameters, optimizer state, batch statistics (+ gradient accumulator)
    temp_bytes: int  # largest temporary of the stage's compiled programs
    stash_bytes: int  # stored stage inputs at the schedule's peak (pipelines)
    send_bytes: int  # activation sent to the next stage per micro-batch (0 on the last)

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
    flops_per_example: int
    schedule: str  # "" without a pipeline
    num_microbatches: int
    events: tuple  # schedules.stage_events, () without a pipeline
    stages: tuple[StageCost, ...]

    @property
    def num_devices(self) -> int:
        return math.prod(self.mesh_shape.values())

    @property
    def memory_bytes_per_device(self) -> int:
        return max(s.memory_bytes for s in self.stages)


def input_spec(config: ml_collections.ConfigDict) -> tuple[tuple[int, int, int], int]:
    """(image shape, classes) of the config's dataset, without loading it where it is known."""
    name = config.data.name
    if name == "synthetic":
        return tuple(config.data.image_shape), int(config.data.num_classes)
    if name in _KNOWN_DATA:
        return _KNOWN_DATA[name]
    from jaxpar import data as data_lib

    spec = data_lib.load(config).spec
    return tuple(spec.image_shape), spec.num_classes


def resolve_mesh(config: ml_collections.ConfigDict, num_devices: int) -> tuple[int, int, int]:
    """The (data, stage, tensor) sizes a row asks for; a -1 fills the profile's devices."""
    shape = mesh_lib.resolve_shape(tuple(config.mesh_shape), num_devices)
    return config_lib.validate(config, math.prod(shape)) if -1 not in shape else shape


def layer_split(model: models.SequentialModel, config, tensor_size: int) -> list[int]:
    """Per layer, how many ways its compute is divided by the tensor axis (1 or t)."""
    if tensor_size == 1:
        return [1] * len(model.layers)
    specs = tensor.variable_specs(model, tensor.rules_from(config))["params"]
    out = []
    for layer in model.layers:
        split = any("tensor" in tuple(s) for s in jax.tree.leaves(specs[layer.name],
                    is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)))  # fmt: skip
        out.append(tensor_size if split else 1)
    return out


def _abstract(shapes, shardings):
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings
    )


def _device_bytes(tree) -> int:
    """Bytes one device holds of an abstract, sharded pytree."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
    return total


def _rows(compiled, mesh_shape: dict[str, int]) -> tuple[Collective, ...]:
    rows = analysis.collective_rows(compiled.as_text(), mesh_shape)
    return tuple(
        Collective(kind, axes, count, nbytes)
        for (kind, axes), (count, nbytes) in sorted(rows.items())
        if axes != "none"
    )


def _memory(compiled) -> tuple[int, int]:
    """(argument + output - alias, temp) bytes of a compiled program, per device."""
    m = compiled.memory_analysis()
    live = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
    return live, m.temp_size_in_bytes


_CACHE: dict[str, Workload] = {}


def workload(config: ml_collections.ConfigDict, num_devices: int | None = None) -> Workload:
    """Costs of `config` on a mesh of its own size (a -1 takes `num_devices`), compiled on
    the first devices jax has (simulated CPU devices are fine). Cached per config."""
    key = f"{config.to_json()} {num_devices}"
    if key not in _CACHE:
        _CACHE[key] = _workload(config, num_devices)
    return _CACHE[key]


def _workload(config: ml_collections.ConfigDict, num_devices: int | None) -> Workload:
    config = ml_collections.ConfigDict(config.to_dict())
    config.sync.impl = "shard_map"  # pmap runs the same collectives; compile one path
    shape = resolve_mesh(config, num_devices or len(jax.devices()))
    n = math.prod(shape)
    if n > len(jax.devices()):
        raise ConfigError(
            f"predicting a {n}-device mesh compiles on {n} devices but jax has "
            f"{len(jax.devices())}; set XLA_FLAGS=--xla_force_host_platform_device_count={n}"
        )
    config.mesh_shape = shape
    image_shape, classes = input_spec(config)
    model = models.build(config.model, image_shape, classes)
    mesh = mesh_lib.make_mesh(shape, jax.devices()[:n])
    strategy = parallel.build(config, model, mesh, optim.make_optimizer(config))
    split = layer_split(model, config, shape[2])
    flops = [layer.flops / t for layer, t in zip(model.layers, split)]
    common = {
        "name": model.name,
        "mesh_shape": dict(mesh.shape),
        "global_batch": int(config.global_batch_size),
        "dtype": config.model.dtype,
        "num_params": model.num_params,
        "param_bytes": 4 * model.num_params,
        "flops_per_example": model.flops_per_example,
    }
    if shape[1] == 1:
        stage = _single(strategy, config, image_shape, flops)
        return Workload(**common, schedule="", num_microbatches=1, events=(), stages=(stage,))
    if strategy.num_chunks > shape[1] or not strategy.remat:  # pipeline efficiency, issue 12
        raise ConfigError(
            "the predictor models one chunk per stage with recomputation; use "
            "pipeline.remat=True and gpipe or 1f1b"
        )
    return Workload(
        **common,
        schedule=strategy.schedule,
        num_microbatches=strategy.num_microbatches,
        events=tuple(tuple(e) for e in strategy.events),
        stages=_pipeline(strategy, config, image_shape, flops),
    )


def _single(strategy, config, image_shape, flops) -> StageCost:
    shapes = jax.eval_shape(strategy.init_state, jax.random.key(0))
    state = _abstract(shapes, strategy.state_sharding)
    b = config.global_batch_size
    batch = {
        "image": jax.ShapeDtypeStruct(
            (b, *image_shape), jnp.float32, sharding=strategy.batch_sharding
        ),
        "label": jax.ShapeDtypeStruct((b,), jnp.int32, sharding=strategy.batch_sharding),
    }
    with jax.set_mesh(strategy.mesh):
        compiled = strategy._jit_train().lower(state, batch).compile()
    live, temp = _memory(compiled)
    return StageCost(
        bounds=(0, len(flops)),
        fwd_flops_per_example=sum(flops),
        collectives={"step": _rows(compiled, dict(strategy.mesh.shape))},
        state_bytes=live,
        temp_bytes=temp,
        stash_bytes=0,
        send_bytes=0,
    )


def _pipeline(strategy, config, image_shape, flops) -> tuple[StageCost, ...]:
    """Lower each stage's forward, backward and update programs with abstract arguments."""
    k, m, d = strategy.num_stages, strategy.num_microbatches, strategy.data
    mb = config.global_batch_size // m
    progs = strategy.programs
    x = jax.ShapeDtypeStruct((mb, *image_shape), jnp.float32, sharding=strategy.batch_sharding[0])
    out = []
    for s in range(k):
        a, b = strategy.bounds[s], strategy.bounds[s + 1]
        st_shapes, acc_shapes = jax.eval_shape(
            lambda r, s=s: strategy._init_stage(r, s), jax.random.key(0)
        )
        st = _abstract(st_shapes, strategy._named(s, strategy.state_specs[s]))
        acc = _abstract(acc_shapes, strategy._named(s, strategy._acc_specs(s)))
        x = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=strategy.batch_sharding[s])
        last = s == k - 1
        with jax.set_mesh(strategy.meshes[s]):
            y, _ = jax.eval_shape(progs["fwd"][s].fn, st.params, st.batch_stats, x)
        if last:
            target = jax.ShapeDtypeStruct((mb,), jnp.int32, sharding=strategy.batch_sharding[s])
        else:
            target = jax.ShapeDtypeStruct(y.shape, y.dtype, sharding=strategy.batch_sharding[s])
        stage_mesh = dict(strategy.meshes[s].shape)
        compiled = {
            "bwd": progs["bwd"][s].lower(st.params, st.batch_stats, x, target, acc).compile(),
            "update": progs["update"][s].lower(st, acc).compile(),
        }
        if not last:
            compiled["fwd"] = progs["fwd"][s].lower(st.params, st.batch_stats, x).compile()
        in_flight = schedules.in_flight(strategy.events[s])
        out.append(
            StageCost(
                bounds=(a, b),
                fwd_flops_per_example=sum(flops[a:b]),
                collectives={name: _rows(c, stage_mesh) for name, c in compiled.items()},
                state_bytes=_device_bytes((st, acc)),
                temp_bytes=max(_memory(c)[1] for c in compiled.values()),
                stash_bytes=in_flight * math.prod(x.shape) * x.dtype.itemsize // d,
                send_bytes=0
                if last
                else _device_bytes(
                    jax.ShapeDtypeStruct(y.shape, y.dtype, sharding=strategy.batch_sharding[s])
                ),
            )
        )
        x = y
    return tuple(out)


def describe(w: Workload) -> dict[str, Any]:
    """Per-device bytes of every collective per step, by (kind, axes), for reports."""
    rows: dict[str, int] = {}
    times = {"step": 1, "fwd": w.num_microbatches, "bwd": w.num_microbatches, "update": 1}
    for stage in w.stages:
        for prog, cols in stage.collectives.items():
            for c in cols:
                key = f"{c.kind} {c.axes}"
                rows[key] = max(rows.get(key, 0), c.bytes * times[prog])
    return rows
