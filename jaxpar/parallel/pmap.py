"""Legacy jax.pmap data parallelism, kept for contrast with shard_map.

The state carries a leading axis of one replica per local device; the batch is reshaped to
[devices, per_device, ...]. The step body is the shard_map strategy's (the same sync rule,
`allreduce`); under pmap values are already per device, so the cast to per-device values is
the identity and `lax.pmean` of the gradient is the one all-reduce.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar import axes
from jaxpar.parallel.buckets import Buckets
from jaxpar.parallel.data import DataParallel
from jaxpar.parallel.replicas import Replicas
from jaxpar.parallel.sync.base import stack


class PmapReplicas(Replicas):
    """Inside pmap every value is per device already: nothing to cast."""

    def varying(self, tree):
        return tree


class PmapDataParallel(DataParallel):
    name = "pmap"
    impl = "pmap"

    @classmethod
    def check(cls, config, shape):
        reason = super().check(config, shape)
        if reason is None and len(axes.replica_axes(shape)) > 1:
            reason = (
                f"sync.impl=pmap maps over one axis, but the mesh {axes.spelled(shape)} "
                "splits the batch over several; use sync.impl=shard_map"
            )
        if reason is None and axes.sharding_axes(shape):
            reason = "sync.impl=pmap keeps whole replicas; fsdp needs sync.impl=shard_map"
        return reason

    def __init__(self, config, model, mesh, tx):
        self.devices = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
        super().__init__(config, model, mesh, tx)
        self.name = "pmap"
        # One replica per local device along a leading axis: the layout pmap consumes.
        self.axis = (self.replicas.axes or axes.batch_axes(dict(mesh.shape)))[0]
        self.stacked = NamedSharding(Mesh(np.array(self.devices), (self.axis,)), P(self.axis))

    def make_replicas(self, shape: dict[str, int]) -> Replicas:
        return PmapReplicas(shape, Buckets.of(self.sync, self.model))

    def _stack(self, tree, xp=jnp):
        return stack(tree, len(self.devices), xp)

    def place(self, host_state):
        return jax.device_put(self._stack(host_state, np), self.stacked)

    def canonical(self, state):
        return jax.tree.map(lambda x: x[0], state)

    def state_shapes(self):
        n = len(self.devices)
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((n, *x.shape), x.dtype, sharding=self.stacked),
            self.canonical_shapes(),
        )

    def put_batch(self, local_batch):
        n = len(self.devices)
        split = {
            k: np.reshape(v, (n, v.shape[0] // n, *v.shape[1:])) for k, v in local_batch.items()
        }
        return jax.device_put(split, self.stacked)

    def batch_shapes(self, batch_size, eval=False):
        n = len(self.devices)
        flat = super().batch_shapes(batch_size, eval)
        return {
            k: jax.ShapeDtypeStruct(
                (n, v.shape[0] // n, *v.shape[1:]), v.dtype, sharding=self.stacked
            )
            for k, v in flat.items()
        }

    def _jit_train(self):
        return jax.pmap(self._train_body, self.axis, devices=self.devices, donate_argnums=0)

    def _lower(self, state, batch):
        return self._jit_train().lower(state, batch)  # no context mesh: pmap has its own

    def train_step(self, state, batch):
        if self._train is None:
            self.compile(state, batch)
        state, metrics = self._train(state, batch)
        return state, jax.tree.map(lambda x: x[0], metrics)  # replica 0's (all equal)

    def eval_step(self, state, batch):
        """Replica 0's sums (every replica holds the psum): two computations, both counted in
        the dispatch window."""
        if self._eval is None:
            self._eval = jax.pmap(self._eval_body, self.axis, devices=self.devices)
        sums = self.inflight.add(self._eval(state, batch))  # no context mesh: pmap has its own
        return self.inflight.add(_first_replica(sums))


@jax.jit
def _first_replica(tree):
    return jax.tree.map(lambda x: x[0], tree)
