"""A complete new mesh axis in one module: `ring`, data parallelism whose gradient average is a
hand-written ring (Baidu's ring all-reduce, as Horovod popularised it).

It shows the extension point of jaxpar/axes/: an axis is an `Axis` (name, role, what it
splits) registered once; the core never names it. `ring` is a batch axis, so the global batch
is split over it, BatchNorm statistics are global over it and synchronisation rules combine
over it like over `data`. What it changes is one hook, `mean`: instead of XLA's all-reduce,
each gradient leaf is summed by a ring of n - 1 neighbour sends (`lax.ppermute`, each moving
1/n of the leaf: every device sends and receives (n-1)/n of it), then gathered (one
all-gather). The compiled step therefore holds collective-permutes on `ring`, which
`--explain` lists and the predictor prices on the links they use, unchanged.

    from tests import example_axis
    example_axis.register()          # then --config.mesh_axes='("data","ring")' works
    ...
    example_axis.unregister()

tests/test_axes.py trains it against one device and reads it through `--explain` and the
predictor.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jaxpar import axes


class Ring(axes.Axis):
    """A batch axis whose gradient mean is a ring reduce-scatter plus an all-gather."""

    def mean(self, x, group, others):
        if others:  # the other replica axes first, XLA's way; then the ring
            x = lax.pmean(x, others)
        return ring_sum(x, self.name) / lax.axis_size(self.name)


def ring_sum(x, axis: str):
    """The sum of `x` over `axis`: the leaf cut in n chunks; in step s = 0..n-2 device i sends
    its running sum of chunk (i - s) mod n to device i + 1, which adds it to its own; after
    n - 1 steps device i holds the whole sum of chunk (i + 1) mod n, and an all-gather gives
    every device every chunk."""
    n = lax.axis_size(axis)
    flat = x.reshape(-1)
    pad = (-flat.size) % n
    chunks = jnp.pad(flat, (0, pad)).reshape(n, -1)
    me = lax.axis_index(axis)
    right = [(i, (i + 1) % n) for i in range(n)]
    for step in range(n - 1):
        sent = lax.dynamic_index_in_dim(chunks, (me - step) % n, keepdims=False)
        got = lax.ppermute(sent, axis, right)
        mine = (me - step - 1) % n  # the chunk the left neighbour sent: add it to ours
        chunks = lax.dynamic_update_index_in_dim(
            chunks, lax.dynamic_index_in_dim(chunks, mine, keepdims=False) + got, mine, 0
        )
    done = lax.dynamic_index_in_dim(chunks, (me + 1) % n, keepdims=False)
    every = lax.all_gather(done, axis, tiled=False, to="invarying")  # [n, chunk]: chunk j
    # device j holds chunk (j + 1) mod n: put chunk c = row c - 1
    whole = jnp.roll(every, 1, axis=0).reshape(-1)
    return whole[: flat.size].reshape(x.shape)


RING = Ring(
    "ring",
    "batch",
    "the global batch; gradients summed around a ring of neighbours",
    word="ring",
    phrase="ring data parallel over {n}",
)


def register() -> axes.Axis:
    return axes.register(RING)


def unregister() -> None:
    axes.unregister(RING.name)
