"""`sharded` (ZeRO stage 1; tf_cnn_benchmarks' distributed variables): reduce-scatter the
gradients, let each replica update its 1/N slice of the parameters with its 1/N slice of the
optimizer state, all-gather the parameters.

Communication per step: one reduce-scatter of the flattened gradient (each device receives
P/N bytes) and one all-gather of the updated parameters (each device receives P bytes) -
together the traffic of one all-reduce, which is itself a reduce-scatter plus an all-gather.
Memory: the optimizer state per device is 1/N of replicated (momentum: P/N; Adam: 2P/N).

Layout: parameters and batch statistics replicated; every parameter-shaped part of the
optimizer state is one flat vector (parameters raveled in a fixed order, zero-padded to a
multiple of N) split over "data". The canonical form is the single-device state (the same
per-layer optimizer state as `allreduce`), so checkpoints move freely between the two.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.sharding import PartitionSpec as P

from jaxpar.parallel.sync.base import AXIS, SyncRule, mean_metrics, varying


class Sharded(SyncRule):
    name = "sharded"

    def __init__(self, config, n, model, tx):
        super().__init__(config, n, model, tx)
        shapes = jax.eval_shape(lambda: model.init(jax.random.key(0))["params"])
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        flat, self._unravel = ravel_pytree(zeros)
        self.size = flat.size
        self.padded = -(-self.size // n) * n
        self.slice = self.padded // n
        self._layers = set(shapes)

    def flatten(self, tree) -> jax.Array:
        flat, _ = ravel_pytree(tree)
        return jnp.pad(flat, (0, self.padded - self.size))

    def unflatten(self, flat: jax.Array):
        return self._unravel(flat[: self.size])

    def _is_params(self, x) -> bool:
        return isinstance(x, dict) and bool(x) and set(x) == self._layers

    def to_device(self, canonical):
        opt = optax.tree_map_params(self.tx, self.flatten, canonical.opt_state,
                                    is_leaf=self._is_params)  # fmt: skip
        return canonical.replace(opt_state=opt)

    def canonical(self, state):
        return state.replace(opt_state=optax.tree_map_params(self.tx, self.unflatten,
                                                             state.opt_state))  # fmt: skip

    def specs(self, shapes):
        flat = lambda s: P(AXIS) if s.shape == (self.padded,) else P()
        return super().specs(shapes).replace(opt_state=jax.tree.map(flat, shapes.opt_state))

    def step(self, state, batch):
        loss, stats, accuracy, grads = self.local_grads(
            varying(state.params), state.batch_stats, batch, self.bn_axis_name
        )
        # Reduce-scatter: device i receives the sum of every replica's slice i.
        mine = lax.psum_scatter(self.flatten(grads), AXIS, scatter_dimension=0, tiled=True)
        mine = mine / self.n
        start = lax.axis_index(AXIS) * self.slice
        params = lax.dynamic_slice(self.flatten(state.params), (start,), (self.slice,))
        params, opt_state = self.apply(mine, state.opt_state, params)
        # All-gather: every replica receives every updated slice.
        flat = lax.all_gather(params, AXIS, tiled=True, to="invarying")
        new_state = state.replace(
            step=state.step + 1,
            params=self.unflatten(flat),
            opt_state=opt_state,
            batch_stats=self.shared_stats(stats),
        )
        return new_state, mean_metrics(loss, accuracy)
