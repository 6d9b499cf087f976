"""`node`: the second level of data parallelism, across nodes (Horovod's hierarchical
all-reduce; HSDP's replica axis). A batch axis like `data`, always the first (outermost) of
the mesh, so each index is a block of consecutive devices: a process, or a machine, in a
multi-process run (devices are numbered process by process), a block of simulated devices
in one process.

What it changes: the gradient mean over a group of replica axes that holds `node` and axes
inside it (data, fsdp) runs in three steps, each on its own links,

    reduce-scatter over the inner axes   (inside a node: each device gets 1/g of the sum)
    all-reduce over node                 (across nodes: 1/g of the bytes per device)
    all-gather over the inner axes       (inside a node)

so what crosses nodes per device is 1/g of the gradient bytes (g = devices per node in the
group), not all of them. `Replicas.mean_grads` hands this hook the gradient leaves of a step
averaged over the same axes as flat buffers of this device's own parts (beside tensor or
spatial: its shards of the leaves they split): one per bucket of `sync.bucket_bytes`, or
one for all of them with buckets off (Horovod's fusion buffer), padded here to a multiple of
g: three collectives a bucket, not three per leaf (VGG19's 33 leaves would pay 99
latencies, which the predictor prices at 5-10 us per ring step: more than the bytes cost on
two H100 nodes). With `node` alone (or beside tensor, spatial, stage only) the mean is
data's, one all-reduce per leaf, and the step compiles data's program
(tests/test_node_programs.py).

Synchronisation modes (sync.mode): `allreduce` averages hierarchically as above (and
`sharded` does for the parameters it cannot split); every other mode treats node x data as
one flat group of replicas, exactly as it treats data alone (parameter_server's server is
replica `sync.server` of the flattened group; local_sgd averages over all; async spreads its
delays over all).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from jaxpar.axes.base import Axis, register


class Node(Axis):
    def fuses(self, others):
        return bool(others)  # alone, its mean is the default all-reduce, leaf by leaf

    def mean(self, x, group, others):
        if not others:
            return None
        g = lax.axis_size(others)
        n = g * lax.axis_size(self.name)
        flat = x.reshape(-1)
        pad = (-flat.size) % g
        if pad:
            flat = jnp.pad(flat, (0, pad))
        part = lax.psum_scatter(flat, others, scatter_dimension=0, tiled=True)  # in the node
        part = lax.psum(part, self.name) / n  # across nodes: 1/g of the bytes
        whole = lax.all_gather(part, others, axis=0, tiled=True, to="invarying")  # in the node
        return whole[: math.prod(x.shape)].reshape(x.shape)


NODE = register(
    Node(
        "node",
        "batch",
        "the global batch across nodes (processes): gradients "
        "reduced inside a node, then across, then gathered",
        word="node",
        phrase="data parallel over {n} nodes",
        outermost=True,
        across_nodes=True,
    )
)
