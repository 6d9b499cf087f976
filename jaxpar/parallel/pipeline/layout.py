"""The layout-free state and a pipeline's per-chunk parts of it, placed.

A canonical TrainState keeps every per-layer dict keyed by layer name (params, batch
statistics, optimizer moments). A pipeline chunk holds the entries of its own layers; `select`
cuts a chunk's part out of a canonical state and `merge` joins the parts back. `ChunkLayout`
places a chunk's part on its stage in its sync rule's layout, and takes it back.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar import mesh as mesh_lib
from jaxpar.parallel.state import state_shapes
from jaxpar.parallel.sync.base import stacked, stacked_size


def merge(trees: list[Any]) -> Any:
    """Merge per-stage pytrees whose dicts hold disjoint layer names (params, optimizer state)
    into one; leaves shared by every stage (step counts) are taken from stage 0."""
    first = trees[0]
    if isinstance(first, dict):  # layer names appear once; other keys ("pending") in every part
        keys = list(dict.fromkeys(key for tree in trees for key in tree))
        return {key: merge([tree[key] for tree in trees if key in tree]) for key in keys}
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(merge(list(parts)) for parts in zip(*trees)))
    if isinstance(first, (tuple, list)):
        return type(first)(merge(list(parts)) for parts in zip(*trees))
    if dataclass_fields := getattr(first, "__dataclass_fields__", None):
        return first.replace(**{k: merge([getattr(t, k) for t in trees]) for k in dataclass_fields})
    return first


def select(tree: Any, keep: set[str], layer_names: set[str]) -> Any:
    """The inverse of `merge`: keep only `keep`'s entries of every dict keyed by layer names."""
    if isinstance(tree, dict):
        if tree and set(tree) <= layer_names:
            return {k: v for k, v in tree.items() if k in keep}
        return {k: select(v, keep, layer_names) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(select(v, keep, layer_names) for v in tree))
    if isinstance(tree, (tuple, list)):
        return type(tree)(select(v, keep, layer_names) for v in tree)
    if fields := getattr(tree, "__dataclass_fields__", None):
        return tree.replace(**{k: select(getattr(tree, k), keep, layer_names) for k in fields})
    return tree


class ChunkLayout:
    """One chunk's placed state: its sync rule's layout of the chunk's layers on its stage's
    devices, plus a per-replica gradient accumulator (params-shaped, with a leading axis over
    the replica axes each leaf is not already split over: fsdp's shards arrive summed). With
    `measure` (the gradient noise scale) the accumulator is a pair: that, and per replica one
    float32 sum of squared norms (chunks.py)."""

    def __init__(self, model, tx, rule, mesh, layers: slice, measure: bool = False):
        self.model, self.tx, self.rule, self.mesh, self.layers = model, tx, rule, mesh, layers
        self.names = {layer.name for layer in model.layers[layers]}
        shared = state_shapes(model, tx, layers)
        self.canonical_shapes = jax.eval_shape(rule.from_shared, shared)
        self.device_shapes = jax.eval_shape(rule.to_device, self.canonical_shapes)
        self.state_specs = rule.specs(self.device_shapes)
        self.acc_specs = stacked(rule.variable_specs["params"], rule.replicas)
        self.acc_shapes = jax.tree.map(
            lambda p, s: jax.ShapeDtypeStruct((stacked_size(s, rule.replicas), *p.shape), p.dtype),
            shared.params,
            rule.variable_specs["params"],
        )
        if measure:
            self.acc_specs = (self.acc_specs, stacked(P(), rule.replicas))
            sq = jax.ShapeDtypeStruct((rule.replicas.count,), jnp.float32)
            self.acc_shapes = (self.acc_shapes, sq)
        self.shardings = (
            mesh_lib.shardings(mesh, self.state_specs),
            mesh_lib.shardings(mesh, self.acc_specs),
        )
        self._canonical = jax.jit(rule.canonical)

    def abstract(self) -> tuple:
        """(state, accumulator) as ShapeDtypeStructs with their shardings."""
        with_sharding = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
        return (
            jax.tree.map(with_sharding, self.device_shapes, self.shardings[0]),
            jax.tree.map(with_sharding, self.acc_shapes, self.shardings[1]),
        )

    def place(self, canonical_host) -> tuple:
        """This chunk's part of a canonical host state on its devices (across processes if
        need be); a shared model starts per-replica modes."""
        part = select(canonical_host, self.names, set(canonical_host.params))
        part = self.rule.fit(part, self.canonical_shapes)
        acc = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), self.acc_shapes)
        acc = mesh_lib.put(acc, self.shardings[1])
        if self.rule.identity_layout:  # a transfer, no program
            return mesh_lib.put(part, self.shardings[0]), acc
        replicated = jax.tree.map(lambda _: NamedSharding(self.mesh, P()), part)
        to_device = jax.jit(self.rule.to_device, out_shardings=self.shardings[0])
        return to_device(mesh_lib.put(part, replicated)), acc

    def canonical(self, state):
        return self._canonical(state)
