"""The data axis as a step body sees it: the collectives a sync rule and a stage program use.

Inside `jax.shard_map` over "data" each device is one replica and these are the usual
`lax` collectives. A step with one replica beside automatic (GSPMD) axes cannot be a shard_map
over "data" (XLA 0.10.2 refuses a manual all-reduce over a size-1 axis next to automatic ones,
and none is needed), so it runs under plain `jit`, and every collective here is the identity.
This is the only place that knows about that case.
"""

from __future__ import annotations

from typing import Any

import jax
from jax import lax

from jaxpar.mesh import DATA


class Replicas:
    """`n` data replicas; n == 1 means no shard_map over "data" and no collectives."""

    def __init__(self, n: int):
        self.n = n

    @property
    def manual(self) -> bool:
        """Whether step bodies run inside shard_map over "data"."""
        return self.n > 1

    def pmean(self, tree: Any) -> Any:
        return lax.pmean(tree, DATA) if self.manual else tree

    def psum(self, tree: Any) -> Any:
        return lax.psum(tree, DATA) if self.manual else tree

    def varying(self, tree: Any) -> Any:
        """Replicated values cast to per-device ones, so that a gradient taken at them stays
        local (without it, shard_map's check_vma already sums the gradient of a replicated
        parameter over "data", and a pmean on top gives n times the true gradient)."""
        return lax.pcast(tree, DATA, to="varying") if self.manual else tree

    def index(self) -> jax.Array | int:
        return lax.axis_index(DATA) if self.manual else 0

    def reduce_scatter(self, x: jax.Array, dim: int) -> jax.Array:
        """Sum over replicas; replica i keeps block i of dimension `dim`."""
        if not self.manual:
            return x
        return lax.psum_scatter(x, DATA, scatter_dimension=dim, tiled=True)

    def all_gather(self, x: jax.Array, dim: int) -> jax.Array:
        """Every replica's block of dimension `dim`, concatenated, on every replica."""
        if not self.manual:
            return x
        return lax.all_gather(x, DATA, axis=dim, tiled=True, to="invarying")

    def ppermute(self, tree: Any, pairs: list[tuple[int, int]]) -> Any:
        return lax.ppermute(tree, DATA, pairs) if self.manual else tree

    def shard_map(self, fn, mesh, in_specs, out_specs, auto_axes: bool):
        """`fn` over the data axis (manual over "data" only when `auto_axes`, the others left
        to GSPMD's sharding rules), or `fn` itself with one replica."""
        if not self.manual:
            return fn
        names = frozenset({DATA}) if auto_axes else frozenset(mesh.axis_names)
        return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                             axis_names=names)  # fmt: skip
