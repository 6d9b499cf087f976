"""The data replicas as a step body sees them: the collectives a sync rule and a stage program
use, over every batch axis of the mesh at once (data; node x data; data x fsdp; ...).

Inside `jax.shard_map` over the replica axes (the batch axes of size > 1, jaxpar/axes/) each
device is one replica and these are the usual `lax` collectives over that tuple of axes;
replica indices are row-major in mesh order. A step with one replica beside automatic (GSPMD)
axes cannot be a shard_map (XLA 0.10.2 refuses a manual all-reduce over a size-1 axis next to
automatic ones, and none is needed), so it runs under plain `jit`, and every collective here
is the identity. This is the only place that knows about that case.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxpar import axes as axes_lib


class Replicas:
    """The data replicas over `shape`'s batch axes; one replica means no shard_map and no
    collectives."""

    def __init__(self, shape: dict[str, int]):
        self.axes = axes_lib.replica_axes(shape)  # batch axes of size > 1, in mesh order
        self.sizes = {a: shape[a] for a in self.axes}
        # the rules axes of size > 1 (tensor, spatial): GSPMD's inside the step body
        self.auto = {a: shape[a] for a in axes_lib.auto_axes(shape)}
        self.count = math.prod(self.sizes.values())

    @property
    def manual(self) -> bool:
        """Whether step bodies run inside shard_map over the replica axes."""
        return self.count > 1

    @property
    def spec(self) -> P:
        """The batch's PartitionSpec: rows split over every replica axis, in mesh order."""
        return P(self.axes) if self.manual else P()

    def pmean(self, tree: Any) -> Any:
        return lax.pmean(tree, self.axes) if self.manual else tree

    def psum(self, tree: Any) -> Any:
        return lax.psum(tree, self.axes) if self.manual else tree

    def mean_grads(self, grads: Any, specs: Any = None) -> Any:
        """The gradient average over the replicas: per leaf, a mean over the replica axes the
        leaf is not split over (a leaf split over fsdp arrives summed over fsdp already, by
        its all-gather's transpose, and is divided by that axis' size); an axis in the group
        may average its own way (node beside data or fsdp: hierarchically, `Axis.mean`).
        Where one does, the leaves averaged over the same axes go as one flat buffer
        (Horovod's tensor fusion): its collectives once a step, not once per leaf, whose
        latencies would add up. Every other leaf takes the default mean on its own, as under
        `data`."""
        if not self.manual:
            return grads
        leaves, treedef = jax.tree.flatten(grads)
        specs = [P()] * len(leaves) if specs is None else treedef.flatten_up_to(specs)
        out: list[Any] = list(leaves)
        fused: dict[tuple, list[int]] = {}
        for i, (g, spec) in enumerate(zip(leaves, specs, strict=True)):
            split = {
                a for part in spec if part for a in (part if isinstance(part, tuple) else (part,))
            }
            over = tuple(a for a in self.axes if a not in split)
            summed = math.prod(self.sizes[a] for a in self.axes if a in split)
            g = out[i] = g / summed if summed > 1 else g
            if not over:
                continue
            if self._fuses(over):
                fused.setdefault((over, g.dtype), []).append(i)
            else:
                out[i] = self._mean(g, over)
        for (over, _), idx in fused.items():
            means = self._fused_mean([out[i] for i in idx], [specs[i] for i in idx], over)
            for i, mean in zip(idx, means, strict=True):
                out[i] = mean
        return treedef.unflatten(out)

    @staticmethod
    def _fuses(group: tuple[str, ...]) -> bool:
        """Whether an axis of `group` averages over it its own way (`Axis.fuses`)."""
        return any(axes_lib.get(a).fuses(tuple(b for b in group if b != a)) for a in group)

    def mean(self, x: jax.Array, spec: P | None = None) -> jax.Array:
        """One leaf's mean over every replica axis, the way the axes average (node:
        hierarchically); `spec`: its PartitionSpec (its split over the rules axes is kept)."""
        if not self.manual:
            return x
        if not self._fuses(self.axes):
            return self._mean(x, self.axes)
        return self._fused_mean([x], [spec or P()], self.axes)[0]

    def _fused_mean(self, leaves: list, specs: list, group: tuple[str, ...]) -> list:
        """The means of `leaves` over `group` by the axes' own hook, as one flat buffer of
        this device's parts of them: the rules axes (tensor, spatial) made manual around it,
        each leaf entering split as its spec says. Under GSPMD a collective over the
        replica axes takes its operand whole over the rules axes, and a flat buffer of
        leaves split along different dimensions cannot be split like any of them: every
        split leaf would be gathered and sliced back (more tensor traffic and many
        collective-permutes a step; tests/test_node_programs.py pins the collectives)."""

        def local(parts):
            mean = self._mean(jnp.concatenate([p.reshape(-1) for p in parts]), group)
            ends = list(itertools.accumulate(p.size for p in parts))[:-1]
            return [m.reshape(p.shape) for m, p in zip(jnp.split(mean, ends), parts, strict=True)]

        if not self.auto:
            return local(leaves)
        ruled = [self._ruled(spec) for spec in specs]
        mesh, manual = jax.sharding.get_abstract_mesh(), frozenset(self.auto)
        # check_vma=False: a leaf whole over the rules axes shares the buffer with split ones,
        # so its mean is typed as varying over them; it is not (every device of the rules
        # axes sums the same numbers over its own group, as the default all-reduce does)
        fn = jax.shard_map(
            local, mesh=mesh, in_specs=(ruled,), out_specs=ruled, axis_names=manual, check_vma=False
        )
        return fn(leaves)

    def _ruled(self, spec: P) -> P:
        """`spec` over the rules axes only (inside the step body the replica axes are
        manual already: a leaf is this device's shard of them)."""
        keep = lambda p: tuple(a for a in (p if isinstance(p, tuple) else (p,)) if a in self.auto)
        return P(*(keep(p) or None if p else None for p in spec))

    def _mean(self, x, group: tuple[str, ...]):
        for a in group:
            out = axes_lib.get(a).mean(x, group, tuple(b for b in group if b != a))
            if out is not None:
                return out
        return lax.pmean(x, group)

    def varying(self, tree: Any) -> Any:
        """Replicated values cast to per-device ones, so that a gradient taken at them stays
        local (without it, shard_map's check_vma already sums the gradient of a replicated
        parameter over the replica axes, and a pmean on top gives n times the true gradient).
        Leaves already varying over some replica axes (shards) are cast over the others."""
        if not self.manual:
            return tree

        def cast(x):
            missing = tuple(a for a in self.axes if a not in jax.typeof(x).mat.varying)
            return lax.pcast(x, missing, to="varying") if missing else x

        return jax.tree.map(cast, tree)

    def index(self) -> jax.Array | int:
        """This replica's index, row-major over the replica axes."""
        return lax.axis_index(self.axes) if self.manual else 0

    def reduce_scatter(self, x: jax.Array, dim: int) -> jax.Array:
        """Sum over replicas; replica i keeps block i of dimension `dim`."""
        if not self.manual:
            return x
        return lax.psum_scatter(x, self.axes, scatter_dimension=dim, tiled=True)

    def all_gather(self, x: jax.Array, dim: int) -> jax.Array:
        """Every replica's block of dimension `dim`, concatenated, on every replica."""
        if not self.manual:
            return x
        return lax.all_gather(x, self.axes, axis=dim, tiled=True, to="invarying")

    def ppermute(self, tree: Any, pairs: list[tuple[int, int]]) -> Any:
        return lax.ppermute(tree, self.axes, pairs) if self.manual else tree

    def shard_map(self, fn, mesh, in_specs, out_specs, auto_axes: bool, check_vma: bool = True):
        """`fn` over the replica axes (manual over those only when `auto_axes`, the others
        left to GSPMD's sharding rules), or `fn` itself with one replica."""
        if not self.manual:
            return fn
        names = frozenset(self.axes) if auto_axes else frozenset(mesh.axis_names)
        return jax.shard_map(
            fn,
            mesh=mesh,
            in_specs=in_specs,
            out_specs=out_specs,
            axis_names=names,
            check_vma=check_vma,
        )
