"""The device mesh over the axes ("data", "stage", "tensor")."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
from jax.sharding import AxisType, Mesh

DATA, STAGE, TENSOR = "data", "stage", "tensor"
AXES = (DATA, STAGE, TENSOR)


def resolve_shape(mesh_shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
    """Replace a single -1 entry by the size that makes the product equal num_devices."""
    shape = tuple(int(s) for s in mesh_shape)
    if shape.count(-1) == 1:
        rest = math.prod(s for s in shape if s != -1)
        if rest > 0 and num_devices % rest == 0:
            shape = tuple(num_devices // rest if s == -1 else s for s in shape)
    return shape


def make_mesh(mesh_shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh with automatic (GSPMD) axis types, so shardings propagate where not explicit."""
    devices = list(devices if devices is not None else jax.devices())
    shape = resolve_shape(mesh_shape, len(devices))
    return jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * len(AXES), devices=devices)
