"""Mesh axes: the registry (base.py) and the built-in axes, one module each.

    data    batch    data parallelism (sync.mode says how replicas agree)
    node    batch    data parallelism across nodes: hierarchical gradient all-reduce
    fsdp    batch    fully sharded data parallelism: parameters sharded, gathered per layer
    stage   layers   pipeline stages
    tensor  rules    channels, laid out by tensor.rules
    spatial rules    rows of every feature map, halos exchanged at band borders

A new axis is one module that registers an `Axis` (tests/example_axis.py is a whole one).
"""

from jaxpar.axes import data, fsdp, node, spatial, stage, tensor  # noqa: F401  (register the built-ins)
from jaxpar.axes.base import (
    ROLES,
    Axis,
    auto_axes,
    batch_axes,
    get,
    names,
    num_replicas,
    num_stages,
    of_role,
    register,
    registered,
    replica_axes,
    sharding_axes,
    spelled,
    stage_axis,
    unregister,
    used,
)

DEFAULT = ("data", "stage", "tensor")

__all__ = [
    "DEFAULT",
    "ROLES",
    "Axis",
    "auto_axes",
    "batch_axes",
    "get",
    "names",
    "num_replicas",
    "num_stages",
    "of_role",
    "register",
    "registered",
    "replica_axes",
    "sharding_axes",
    "spelled",
    "stage_axis",
    "unregister",
    "used",
]
