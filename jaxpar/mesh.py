"""The device mesh over a run's named axes (`config.mesh_axes`, sized by `config.mesh_shape`).

The axes and what each does are in jaxpar/axes/; this module only lays devices out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar import axes as axes_lib


def axis_names(config) -> tuple[str, ...]:
    """The run's mesh axes: config.mesh_axes, or the default (data, stage, tensor)."""
    return tuple(config.get("mesh_axes", None) or axes_lib.DEFAULT)


def resolve_shape(mesh_shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
    """Replace a single -1 entry by the size that makes the product equal num_devices."""
    shape = tuple(int(s) for s in mesh_shape)
    if shape.count(-1) == 1:
        rest = math.prod(s for s in shape if s != -1)
        if rest > 0 and num_devices % rest == 0:
            shape = tuple(num_devices // rest if s == -1 else s for s in shape)
    return shape


def shape_of(config, num_devices: int) -> dict[str, int]:
    """{axis: size} of a config's mesh with its -1 resolved for `num_devices` (unchecked)."""
    return dict(zip(axis_names(config), resolve_shape(config.mesh_shape, num_devices), strict=True))


def make_mesh(shape: dict[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh with automatic (GSPMD) axis types, so shardings propagate where not explicit."""
    devices = list(devices if devices is not None else jax.devices())
    names = tuple(shape)
    return jax.make_mesh(
        tuple(shape.values()), names, axis_types=(AxisType.Auto,) * len(names), devices=devices
    )


def index_along(mesh: Mesh, axis: str, index: int) -> Mesh:
    """The slice of `mesh` at `index` along `axis`, that axis kept with size 1 (a pipeline
    stage's devices: the other axes still apply there)."""
    position = mesh.axis_names.index(axis)
    devices = np.take(mesh.devices, [index], axis=position)
    return Mesh(devices, mesh.axis_names, axis_types=mesh.axis_types)


def first_device(shape: dict[str, int], at: dict[str, int]) -> int:
    """The mesh-order index of the device at coordinates `at` (other axes at 0)."""
    coords = tuple(at.get(a, 0) for a in shape)
    return int(np.ravel_multi_index(coords, tuple(shape.values()))) if shape else 0


def spelled_shape(names: Sequence[str], sizes: Sequence[int]) -> str:
    """--config.mesh_shape as a user writes it: "'(8,1,1)'"."""
    return "'(" + ",".join(str(s) for s in sizes) + ("," if len(sizes) == 1 else "") + ")'"


def example(names: Sequence[str], num_devices: int) -> str:
    """One mesh of these axes that fits `num_devices`: every device on the first batch axis
    (else the first axis), the rest 1; as the flag that sets it."""
    names = tuple(names)
    batch = [a for a in names if axes_lib.registered(a) and axes_lib.get(a).role == "batch"]
    first = batch[0] if batch else names[0]
    sizes = [num_devices if a == first else 1 for a in names]
    return f"--config.mesh_shape={spelled_shape(names, sizes)}"


def spec_axes(spec: P) -> set[str]:
    """The mesh axes a PartitionSpec splits over."""
    return {a for part in spec if part for a in (part if isinstance(part, tuple) else (part,))}


def is_spec(x) -> bool:
    """Whether `x` is a PartitionSpec: the leaves of a tree of specs (`is_leaf=is_spec`; a
    spec is a tuple, which jax.tree would otherwise open)."""
    return isinstance(x, P)


def shardings(mesh: Mesh, specs: Any) -> Any:
    """The NamedShardings on `mesh` of a tree of PartitionSpecs."""
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=is_spec)


def put(tree, shardings):
    """Host values onto (possibly multi-process) shardings, always as new arrays: each
    process supplies the blocks of its own devices from the whole host value it holds."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings, may_alias=False)
    return jax.tree.map(
        lambda x, sh: jax.make_array_from_callback(np.shape(x), sh, lambda i: np.asarray(x)[i]),
        tree,
        shardings,
    )
