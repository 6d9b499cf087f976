"""What a mesh axis is, and the registry of them.

A run's mesh is a tuple of named axes (`config.mesh_axes`), each sized by `config.mesh_shape`.
Every axis is declared once, as an `Axis` registered here by the module that gives it meaning
(jaxpar/axes/*.py, or a user's own module: tests/example_axis.py). The core never spells an
axis name: it asks the registry which of a run's axes split the batch, which one cuts the
layers into stages and which ones the sharding rules lay variables out over, and calls the
axis' hooks where an axis changes what a step does.

An axis plays one role:

- `batch`: the global batch is split over it (data, node, fsdp). A step is SPMD over every
  batch axis of size > 1 (`jax.shard_map`, manual); the data replicas are all of them
  together, in mesh order, and synchronisation rules combine over them. Hooks: `mean` (how a
  gradient is averaged when this axis is in the group, e.g. node's hierarchical all-reduce)
  and `fuses` (whether it takes the step's gradient leaves as one buffer),
  `param_dims` (which dimension of a parameter the axis shards, e.g. fsdp) and `gather`.
- `layers`: the layers are cut into consecutive stages, one per index (stage); each stage
  runs on its slice of the mesh, where the other axes still apply.
- `rules`: variables and activations are laid out by sharding rules (`tensor.rules`: logical
  dimension names -> mesh axes) and XLA's SPMD partitioner inserts the collectives (tensor,
  spatial). Hooks: `rules` (the logical names the axis splits when the config's rules do not
  say, e.g. spatial's ("height", "spatial")), `joins` (layers whose outputs it leaves whole).

Any axis may refuse a config or, once built, a model (`check`, one line before compiling) and
describe what it does to one (`describe`, printed by --explain).

An axis of size 1 costs nothing: it is in the mesh, and no collective runs over it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

ROLES = ("batch", "layers", "rules")


@dataclasses.dataclass(frozen=True)
class Axis:
    """One mesh axis: its name, role and what it does. Subclass to change a hook."""

    name: str
    role: str  # one of ROLES
    doc: str  # what it partitions, one line (shown by --explain)
    word: str = ""  # the partitioning's word in run names ("data", "pipeline", ...); name if ""
    # the split in words when it is the only one ({n}: the size)
    phrase: str = "{n}-way split"
    # Must it be the first (outermost) axis of the mesh? Devices are numbered in mesh order and
    # processes own consecutive devices, so only the first axis spans processes and nodes as
    # whole blocks (node).
    outermost: bool = False
    # How the predictor places it on a machine: its collectives are priced on the links their
    # groups span (jaxpar/predict/profiles/hardware.py). Devices fill a profile's nodes in mesh order,
    # except that each index of an `across_nodes` axis starts a node of its own (node): its
    # collectives then cross nodes whatever the other axes' sizes.
    across_nodes: bool = False
    # Does it shard parameters (and their gradients and optimizer state) along one dimension
    # each (`param_dim`), gathering them where a layer runs (`gather`)? (fsdp)
    shards_params: bool = False
    # Rules axes: (logical name, this axis) pairs added to a run's sharding rules when the axis
    # is in its mesh with size > 1, for names the config's rules do not map there already.
    rules: tuple = ()
    # Are its all-reduces sums of whole parameters' gradients, as a batch axis' are (spatial:
    # each band's share of every weight gradient)? The predictor lets them overlap the
    # backward as it does data parallelism's.
    sums_gradients: bool = False

    @property
    def label(self) -> str:
        return self.word or self.name

    # -- hooks (any axis) ---------------------------------------------------------------------

    def check(self, config, sizes: dict[str, int], model=None) -> str | None:
        """Why this axis cannot run `config` on a mesh of these sizes (one line), or None.
        Called for every axis of the mesh as the config is validated (`model` None), then for
        those of size > 1 with the built `model`: the refusals only the model tells (maps too
        small to split). Both before anything is compiled."""
        return None

    def describe(self, config, sizes: dict[str, int], model) -> str | None:
        """What this axis does to `model`, for --explain (a table), or None."""
        return None

    # -- hooks (rules axes) -------------------------------------------------------------------

    def joins(self, sizes: dict[str, int], model) -> frozenset:
        """Names of the layers whose outputs this axis leaves whole (its logical names map
        to no mesh axis there), e.g. spatial's layers after the maps stop dividing."""
        return frozenset()

    # -- hooks (batch axes) -------------------------------------------------------------------

    def mean(self, x, group: tuple[str, ...], others: tuple[str, ...]) -> Any:
        """The mean of `x` over the replica axes `group` (this axis among them), inside
        shard_map, or None to leave it to the default (one all-reduce, `lax.pmean`).
        `others`: the group without this axis."""
        return None

    def fuses(self, others: tuple[str, ...]) -> bool:
        """Whether `mean` over this axis and `others` is this axis' own (not None), so that
        `Replicas.mean_grads` hands it the leaves averaged over that group as flat buffers
        (this device's own parts: manual over every axis), even with buckets off. Default:
        wherever `mean` is overridden."""
        return type(self).mean is not Axis.mean

    def param_dim(self, shape: tuple[int, ...], names: tuple, taken: tuple, size: int):
        """The dimension of a parameter leaf (its shape, its dimensions' logical names, and
        which dimensions other axes split already) this axis shards it along, or None to keep
        it whole (axes with `shards_params`)."""
        return

    def gather(self, x, dim: int):
        """Inside shard_map: the whole leaf from this device's shard along `dim`."""
        raise NotImplementedError(f"axis {self.name} shards no parameters")


_REGISTRY: dict[str, Axis] = {}


def register(axis: Axis, replace: bool = False) -> Axis:
    """Add `axis` to the registry (a name may be registered once unless `replace`)."""
    if axis.role not in ROLES:
        raise ValueError(f"axis {axis.name!r}: role {axis.role!r} is not one of {ROLES}")
    if axis.name in _REGISTRY and not replace and _REGISTRY[axis.name] != axis:
        raise ValueError(f"mesh axis {axis.name!r} is registered already")
    _REGISTRY[axis.name] = axis
    return axis


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def get(name: str) -> Axis:
    return _REGISTRY[name]


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def registered(name: str) -> bool:
    return name in _REGISTRY


# -- a run's axes, by role: the only way the core learns which axis does what ---------------


def of_role(shape: dict[str, int], role: str) -> tuple[str, ...]:
    """The mesh's axes of `role`, in mesh order (every size)."""
    return tuple(a for a in shape if _REGISTRY[a].role == role)


def batch_axes(shape: dict[str, int]) -> tuple[str, ...]:
    """Axes the global batch is split over, in mesh order (every size)."""
    return of_role(shape, "batch")


def replica_axes(shape: dict[str, int]) -> tuple[str, ...]:
    """Batch axes of size > 1: what a step is SPMD over and replicas combine over."""
    return tuple(a for a in batch_axes(shape) if shape[a] > 1)


def num_replicas(shape: dict[str, int]) -> int:
    """Data replicas: the product of the batch axes' sizes."""
    return math.prod(shape[a] for a in batch_axes(shape))


def stage_axis(shape: dict[str, int]) -> str | None:
    axes = of_role(shape, "layers")
    return axes[0] if axes else None


def num_stages(shape: dict[str, int]) -> int:
    axis = stage_axis(shape)
    return shape[axis] if axis else 1


def auto_axes(shape: dict[str, int]) -> tuple[str, ...]:
    """Axes left to the sharding rules (and XLA's SPMD partitioner), size > 1."""
    return tuple(a for a in of_role(shape, "rules") if shape[a] > 1)


def sharding_axes(shape: dict[str, int]) -> tuple[str, ...]:
    """Batch axes of size > 1 that shard parameters (fsdp)."""
    return tuple(a for a in replica_axes(shape) if _REGISTRY[a].shards_params)


def used(shape: dict[str, int]) -> dict[str, int]:
    """The axes of size > 1."""
    return {a: n for a, n in shape.items() if n > 1}


def spelled(shape: dict[str, int]) -> str:
    """A mesh as users write it: "(data=2, stage=2, tensor=2)"."""
    return "(" + ", ".join(f"{a}={n}" for a, n in shape.items()) + ")"
