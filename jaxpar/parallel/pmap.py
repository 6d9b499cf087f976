"""Legacy jax.pmap data parallelism, kept for contrast with shard_map.

The state carries a leading axis of one replica per local device; the batch is reshaped to
[devices, per_device, ...]. Under pmap values are per-device, so `lax.pmean` of the gradient
is the one all-reduce (same body as the shard_map path, without the cast).
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar.parallel.common import Strategy, eval_sums
from jaxpar.parallel.common import init_state as _init_state
from jaxpar.parallel.data import AXIS, replica_step


class PmapDataParallel(Strategy):
    name = "pmap"

    def __init__(self, config, model, mesh, tx):
        super().__init__(config, model, mesh, tx)
        self.devices = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
        self.bn_axis_name = AXIS if config.sync.batch_norm == "global" else None
        # One replica per local device along a leading axis: the layout pmap consumes.
        self.stacked = NamedSharding(Mesh(np.array(self.devices), (AXIS,)), P(AXIS))

    def init_state(self, rng):
        state = jax.jit(functools.partial(_init_state, self.model, self.tx))(rng)
        n = len(self.devices)
        stacked = jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *x.shape)), state)
        return jax.device_put(stacked, self.stacked)

    def put_batch(self, local_batch):
        n = len(self.devices)
        split = {
            k: np.reshape(v, (n, v.shape[0] // n, *v.shape[1:])) for k, v in local_batch.items()
        }
        return jax.device_put(split, self.stacked)

    def place(self, host_state):
        n = len(self.devices)
        stacked = jax.tree.map(lambda x: np.broadcast_to(x, (n, *np.shape(x))), host_state)
        return jax.device_put(stacked, self.stacked)

    def _mesh_context(self):
        return contextlib.nullcontext()  # pmap builds its own mesh; a context mesh clashes

    def canonical(self, state):
        return jax.tree.map(lambda x: x[0], state)

    def _jit_train(self):
        def body(state, batch):
            new_state, metrics = replica_step(
                self.model, self.tx, self.bn_axis_name, state, batch, local_params=state.params
            )
            return new_state, metrics

        return _PmapAOT(jax.pmap(body, AXIS, devices=self.devices, donate_argnums=0))

    def _jit_eval(self):
        def body(state, batch):
            return lax.psum(eval_sums(self.model, state.params, state.batch_stats, batch), AXIS)

        return jax.pmap(body, AXIS, devices=self.devices)

    def eval_step(self, state, batch):
        """Replica 0's sums (every replica holds the psum): two computations, both counted in
        the dispatch window."""
        return self.inflight.add(_first_replica(super().eval_step(state, batch)))


@jax.jit
def _first_replica(tree):
    return jax.tree.map(lambda x: x[0], tree)


class _PmapAOT:
    """Give pmap the lower/compile interface of jit; metrics come back as replica 0's."""

    def __init__(self, fn):
        self.fn = fn

    def lower(self, *args):
        self._lowered = self.fn.lower(*args)
        return self

    def compile(self):
        self._compiled = self._lowered.compile()
        return self

    def as_text(self):
        return self._compiled.as_text()

    def memory_analysis(self):
        return self._compiled.memory_analysis()

    def __call__(self, state, batch):
        state, metrics = self._compiled(state, batch)
        return state, jax.tree.map(lambda x: x[0], metrics)
