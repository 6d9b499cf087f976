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

import math
from typing import Any

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxpar import axes as axes_lib
from jaxpar.mesh import spec_axes
from jaxpar.parallel import buckets as buckets_lib
from jaxpar.parallel.buckets import Buckets


class Replicas:
    """The data replicas over `shape`'s batch axes; one replica means no shard_map and no
    collectives. `buckets`: how the gradient collectives pack their leaves (buckets.py)."""

    def __init__(self, shape: dict[str, int], buckets: Buckets | None = None):
        self.buckets = buckets or Buckets()
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
        With buckets (`sync.bucket_bytes`), the leaves averaged over the same axes go as flat
        buffers of at most that size, in the backward's order: one collective per bucket.
        Without, an axis that averages its own way takes them all as one flat buffer
        (Horovod's tensor fusion: its collectives once a step, not once per leaf, whose
        latencies would add up), and every other leaf takes the default mean on its own."""
        if not self.manual:
            return grads
        paths, leaves, specs, treedef = _flat(grads, specs)
        return treedef.unflatten(self._mean_leaves(paths, leaves, specs))

    def _mean_leaves(self, paths: list, leaves: list, specs: list) -> list:
        out: list[Any] = list(leaves)
        groups: dict[tuple, list[int]] = {}
        for i, (g, spec) in enumerate(zip(leaves, specs, strict=True)):
            split = spec_axes(spec)
            over = tuple(a for a in self.axes if a not in split)
            summed = math.prod(self.sizes[a] for a in self.axes if a in split)
            g = out[i] = g / summed if summed > 1 else g
            if over:
                groups.setdefault((over, g.dtype), []).append(i)
        order = self.buckets.order(paths)
        for (over, _), idx in groups.items():
            if not self.buckets.on and not self._fuses(over):
                for i in idx:
                    out[i] = self._mean(out[i], over)
                continue
            mean = lambda ps, over=over: buckets_lib.unpack(
                self._mean(buckets_lib.pack(ps), over), ps
            )
            self._each_bucket(lambda _, mean=mean: mean, order, idx, out, specs)
        return out

    def scatter_grads(self, grads: Any, dims: Any, specs: Any) -> Any:
        """The gradient average with replica i keeping block i of each leaf along its
        dimension in `dims` (a reduce-scatter; `sync.mode=sharded`), a leaf whose dimension
        is None averaged whole (`mean_grads`). With buckets, the scattered leaves go as
        [replicas, n] buffers, one reduce-scatter per bucket."""
        if not self.manual:
            return grads
        paths, leaves, specs, treedef = _flat(grads, specs)
        dims = treedef.flatten_up_to(dims)
        whole = [i for i, d in enumerate(dims) if d is None]
        out: list[Any] = list(leaves)
        means = self._mean_leaves(
            [paths[i] for i in whole], [leaves[i] for i in whole], [specs[i] for i in whole]
        )
        for i, m in zip(whole, means, strict=True):
            out[i] = m
        cut = [i for i, d in enumerate(dims) if d is not None]
        n = self.count
        if not self.buckets.on:
            for i in cut:
                out[i] = self.reduce_scatter(leaves[i], dims[i]) / n
            return treedef.unflatten(out)

        def scatter(parts, ds):
            rows = buckets_lib.pack_rows(parts, ds, n)
            mine = lax.psum_scatter(rows, self.axes, scatter_dimension=0, tiled=True)
            return buckets_lib.unpack_rows(mine / n, parts, ds, n)

        def per_bucket(bucket):
            ds = [dims[i] for i in bucket]
            return lambda ps: scatter(ps, ds)

        self._each_bucket(per_bucket, self.buckets.order(paths), cut, out, specs)
        return treedef.unflatten(out)

    def _each_bucket(self, fn_of, order: list[int], idx: list[int], out: list, specs: list):
        """`out[i]` for the leaves `idx`, replaced bucket by bucket by `fn_of(bucket)` (a
        list of this device's parts in, a list of the same leaves out; `_on_parts`)."""
        for bucket in self._buckets(order, idx, out):
            parts = [out[i] for i in bucket]
            results = self._on_parts(fn_of(bucket), parts, [specs[i] for i in bucket])
            for i, result in zip(bucket, results, strict=True):
                out[i] = result

    def _buckets(self, order: list[int], idx: list[int], leaves: list) -> list[list[int]]:
        """The leaves `idx` in the backward's `order`, cut into buckets (all of them in one
        without a bucket size: an axis that averages its own way)."""
        mine = set(idx)
        ordered = [i for i in order if i in mine]
        if not self.buckets.on:
            return [ordered]
        nbytes = {i: leaves[i].size * leaves[i].dtype.itemsize for i in ordered}
        return self.buckets.split(ordered, nbytes)

    def _on_parts(self, fn, leaves: list, specs: list) -> list:
        """`fn` over this device's parts of `leaves` (a list in, a list of the same shapes
        out), the rules axes (tensor, spatial) made manual around it, each leaf entering
        split as its spec says. Under GSPMD a collective over the replica axes takes its
        operand whole over the rules axes, and a flat buffer of leaves split along different
        dimensions cannot be split like any of them: every split leaf would be gathered and
        sliced back (more tensor traffic and many collective-permutes a step;
        tests/test_node_programs.py pins the collectives)."""
        if not self.auto:
            return fn(leaves)
        ruled = [self._ruled(spec) for spec in specs]
        mesh, manual = jax.sharding.get_abstract_mesh(), frozenset(self.auto)
        # check_vma=False: a leaf whole over the rules axes shares the buffer with split ones,
        # so its result is typed as varying over them; it is not (every device of the rules
        # axes reduces the same numbers over its own group, as the default collective does)
        wrapped = jax.shard_map(
            fn, mesh=mesh, in_specs=(ruled,), out_specs=ruled, axis_names=manual, check_vma=False
        )
        return wrapped(leaves)

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
        mean = lambda ps: buckets_lib.unpack(self._mean(buckets_lib.pack(ps), self.axes), ps)
        return self._on_parts(mean, [x], [spec or P()])[0]

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

    def ppermute(self, tree: Any, pairs: list[tuple[int, int]], specs: Any = None) -> Any:
        """`tree` sent along `pairs` of replica indices; with buckets, as flat buffers of at
        most the bucket size (`specs`: the leaves' PartitionSpecs, for their split over the
        rules axes)."""
        if not self.manual:
            return tree
        if not self.buckets.on:
            return lax.ppermute(tree, self.axes, pairs)
        paths, leaves, specs, treedef = _flat(tree, specs)
        out: list[Any] = list(leaves)
        send = lambda ps: buckets_lib.unpack(
            lax.ppermute(buckets_lib.pack(ps), self.axes, pairs), ps
        )
        by_dtype: dict[Any, list[int]] = {}
        for i, x in enumerate(leaves):
            by_dtype.setdefault(x.dtype, []).append(i)
        order = self.buckets.order(paths)
        for idx in by_dtype.values():
            self._each_bucket(lambda _: send, order, idx, out, specs)
        return treedef.unflatten(out)

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


def _flat(tree: Any, specs: Any) -> tuple[list, list, list, Any]:
    """A tree's leaf paths, leaves and specs (`P()` each where `specs` is None), and its
    structure."""
    paths_leaves, treedef = jax.tree.flatten_with_path(tree)
    leaves = [x for _, x in paths_leaves]
    specs = [P()] * len(leaves) if specs is None else treedef.flatten_up_to(specs)
    return [p for p, _ in paths_leaves], leaves, specs, treedef
