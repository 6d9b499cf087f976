"""Gradient buckets: leaves packed into flat buffers of at most `sync.bucket_bytes`, in the
order the backward produces them, so that one collective carries a bucket (PyTorch DDP's
buckets, Horovod's tensor fusion).

Why jaxpar packs them itself: XLA:GPU combines small all-reduces after fusion and then slices
the combined result apart, one kernel per parameter, which no later pass fuses into the update
(Inception-v3 on 8 P100s: 475 slice kernels a step). A buffer packed before XLA's fusion is
split by slices that fuse into the update's own kernels. Under a scheduler that overlaps
collectives with compute, a bucket's collective can start as soon as the backward has produced
its last leaf, so buckets follow the backward's order: the last layer's gradients first.

`Buckets` holds the setting and the model's layer order; `pack` and `unpack` move leaves in
and out of the flat buffers, `pack_rows` and `unpack_rows` do the same for leaves each split
into one row per replica (a bucketed reduce-scatter).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Buckets:
    """`max_bytes`: a bucket's largest size (0: no buckets, one collective per leaf, XLA
    combining them as it will); `layers`: the model's top-level parameter names in forward
    order (a leaf under none of them goes last, as the backward reaches it first)."""

    max_bytes: int = 0
    layers: tuple[str, ...] = ()

    @classmethod
    def of(cls, sync, model) -> Buckets:
        """The buckets of a run's sync settings (`run_spec.SyncSpec`) for `model`."""
        return cls(int(sync.bucket_bytes), tuple(layer.name for layer in model.layers))

    @property
    def on(self) -> bool:
        return self.max_bytes > 0

    def order(self, paths: Sequence[tuple]) -> list[int]:
        """Leaf indices in the order the backward produces them: layers from the last to
        the first, each layer's leaves in reverse tree order."""
        rank = {name: i for i, name in enumerate(self.layers)}

        def key(i: int) -> tuple[int, int]:
            top = _key_name(paths[i][0]) if paths[i] else None
            return (-rank.get(top, len(self.layers)), -i)

        return sorted(range(len(paths)), key=key)

    def split(self, indices: Sequence[int], nbytes: Sequence[int]) -> list[list[int]]:
        """`indices` (in backward order) cut into consecutive buckets of at most
        `max_bytes`; a leaf larger than that is a bucket of its own. Without buckets, every
        leaf alone."""
        if not self.on:
            return [[i] for i in indices]
        out: list[list[int]] = []
        size = 0
        for i in indices:
            if out and size + nbytes[i] <= self.max_bytes:
                out[-1].append(i)
                size += nbytes[i]
            else:
                out.append([i])
                size = nbytes[i]
        return out

    def of_tree(self, tree) -> list[list[int]]:
        """The buckets of every leaf of `tree` (arrays or shapes), as indices of its
        flattened leaves: what one collective per bucket carries."""
        paths_leaves = jax.tree.flatten_with_path(tree)[0]
        nbytes = [math.prod(x.shape) * x.dtype.itemsize for _, x in paths_leaves]
        return self.split(self.order([p for p, _ in paths_leaves]), nbytes)


def _key_name(key) -> str | None:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return None


def pack(leaves: Sequence[jax.Array]) -> jax.Array:
    """The leaves flattened into one buffer (they share a dtype), a convolution's kernel
    (H, W, I, O) in the order (O, H, W, I): the layout XLA:GPU keeps it in (the filter layout
    of cuDNN's NHWC convolutions, data.py's `_compiler_layouts`), so that on a GPU packing and
    unpacking it reorder nothing and the pieces fuse into the update."""
    return jnp.concatenate([_filter_first(x).reshape(-1) for x in leaves])


def unpack(flat: jax.Array, like: Sequence[jax.Array]) -> list[jax.Array]:
    """`pack`'s inverse: pieces of `flat` shaped as `like`."""
    ends = list(itertools.accumulate(x.size for x in like))[:-1]
    pieces = jnp.split(flat, ends)
    return [_filter_last(p, x.shape) for p, x in zip(pieces, like, strict=True)]


def _filter_first(x: jax.Array) -> jax.Array:
    """A convolution's kernel (H, W, I, O) as (O, H, W, I); any other leaf as it is."""
    return jnp.moveaxis(x, -1, 0) if x.ndim == 4 else x


def _filter_last(piece: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """`_filter_first`'s inverse on a flat piece: the leaf of `shape`."""
    if len(shape) != 4:
        return piece.reshape(shape)
    return jnp.moveaxis(piece.reshape(shape[-1], *shape[:-1]), 0, -1)


def pack_rows(leaves: Sequence[jax.Array], dims: Sequence[int], rows: int) -> jax.Array:
    """The leaves as one [rows, n] buffer: row r holds block r of each leaf along its
    dimension `dims[i]` (which `rows` divides), so that a tiled reduce-scatter over the rows
    leaves replica r its block of every leaf."""
    parts = [jnp.moveaxis(x, d, 0).reshape(rows, -1) for x, d in zip(leaves, dims, strict=True)]
    return jnp.concatenate(parts, axis=1)


def unpack_rows(row: jax.Array, like: Sequence, dims: Sequence[int], rows: int) -> list:
    """One replica's row of `pack_rows`' buffer (after the reduce-scatter) back into that
    replica's block of each leaf: `like[i]`'s shape with dimension `dims[i]` divided by
    `rows`."""
    blocks = []
    for x, d in zip(like, dims, strict=True):
        shape = list(x.shape)
        shape[d] //= rows
        blocks.append((shape, d))
    ends = list(itertools.accumulate(math.prod(s) for s, _ in blocks))[:-1]
    out = []
    for part, (shape, d) in zip(jnp.split(row.reshape(-1), ends), blocks, strict=True):
        moved = [shape[d]] + [n for k, n in enumerate(shape) if k != d]
        out.append(jnp.moveaxis(part.reshape(moved), 0, d))
    return out
