"""`sharded` (ZeRO stage 1; tf_cnn_benchmarks' distributed variables): reduce-scatter the
gradients, let each replica update its 1/N slice of the parameters with its 1/N slice of the
optimizer state, all-gather the parameters.

Layout: parameters and batch statistics replicated over the replica axes (data, or node x
data as one flat group); every parameter-shaped part of the optimizer state is split over
them along one dimension of its own (per parameter:
the largest dimension that is not split over "tensor" and divides by N; a parameter with none,
every dimension odd under 2 replicas say, keeps its optimizer state replicated and is updated
as under `allreduce`). So the optimizer state per
device is about 1/N of replicated (momentum: P/N; Adam: 2P/N), and under tensor parallelism
each tensor shard's replicas split that shard's state. The canonical form is the single-device
state (only the layout differs), so checkpoints move freely between modes and meshes.

Communication per step: per split parameter one reduce-scatter of its gradient (each device
receives P/N bytes) and one all-gather of its updated slices (each device receives P bytes):
together the traffic of one all-reduce, which is itself a reduce-scatter plus an all-gather.

The optimizer must be elementwise (SGD, Adam): a slice's update must not depend on the rest.
"""

from __future__ import annotations

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxpar.mesh import is_spec
from jaxpar.parallel import norms
from jaxpar.parallel.sync.base import SyncRule


class Sharded(SyncRule):
    name = "sharded"
    combines = True

    @classmethod
    def check(cls, config, data):
        if config.optimizer.name not in ("sgd", "adam"):
            return (
                f"sync.mode=sharded updates slices of each parameter, which needs an "
                f"elementwise optimizer (sgd, adam), not {config.optimizer.name}"
            )
        return None

    def split_dims(self, param_shapes) -> dict:
        """Per parameter leaf, the dimension its optimizer state is split along (or None)."""

        def choose(shape, spec: P):
            parts = tuple(spec) + (None,) * (len(shape.shape) - len(spec))
            replicas = self.num_replicas
            free = [d for d, n in enumerate(shape.shape) if parts[d] is None and n % replicas == 0]
            return max(free, key=lambda d: shape.shape[d]) if free and replicas > 1 else None

        return jax.tree.map(choose, param_shapes, self.variable_specs["params"])

    def specs(self, shapes):
        specs = super().specs(shapes)
        param_specs = self.slice_specs(shapes.params)
        return specs.replace(opt_state=self.like_params(shapes.opt_state, param_specs))

    def slice_specs(self, param_shapes):
        """Per parameter, the spec of this replica's slice: its own, split over the replica
        axes along `split_dims`' dimension."""
        dims = self.split_dims(param_shapes)

        def add_data(spec: P, dim, shape):
            if dim is None:
                return spec
            parts = list(spec) + [None] * (len(shape.shape) - len(spec))
            parts[dim] = (
                self.replicas.axes if len(self.replicas.axes) > 1 else self.replicas.axes[0]
            )
            return P(*parts)

        return jax.tree.map(
            add_data, self.variable_specs["params"], dims, param_shapes, is_leaf=is_spec
        )

    def _dims(self, state):
        shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state.params)
        return shapes, self.split_dims(shapes)

    def combine(self, state, grads):
        """Reduce-scatter: replica i keeps the mean of every replica's slice i of each split
        parameter's gradient (a parameter with no split dimension is averaged whole); with
        buckets, one reduce-scatter per bucket."""
        shapes, dims = self._dims(state)
        grads = self.replicas.scatter_grads(grads, dims, self.variable_specs["params"])
        return grads, norms.sq_norm(grads, self.slice_specs(shapes), self.manual_axes)

    def apply(self, state, combined, stats, noise=None):
        """Each replica updates its slices, then all-gathers every updated slice."""
        _, dims = self._dims(state)
        r = self.replicas
        size = lambda x, d: x.shape[d] // self.num_replicas

        def my_param(p, d):
            return (
                p
                if d is None
                else lax.dynamic_slice_in_dim(p, r.index() * size(p, d), size(p, d), d)
            )

        mine = state.replace(params=jax.tree.map(my_param, state.params, dims))
        new = mine.apply_gradients(self.tx, combined, noise, batch_stats=self.shared_stats(stats))
        gather = lambda p, d: p if d is None else r.all_gather(p, d)
        return new.replace(params=jax.tree.map(gather, new.params, dims))
