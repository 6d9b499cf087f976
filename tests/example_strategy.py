"""An example strategy, written as a user would add one: one module and one registry line.

`GSPMDData` is data parallelism left entirely to XLA's SPMD partitioner: plain `jax.jit` over
a batch sharded along the mesh's batch axes and a replicated state, no shard_map and no explicit collective
(XLA inserts the gradient all-reduce itself). It implements the protocol of
jaxpar/parallel/strategy.py and nothing else; the trainer, `--explain`, the analysis and the
predictor use it unchanged.

    from jaxpar import parallel
    parallel.STRATEGIES["gspmd"] = GSPMDData          # the registry line
    config.strategy = "gspmd"
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar import axes
from jaxpar.parallel.state import eval_sums, init_state, loss_and_grads
from jaxpar.parallel.strategy import Program, Strategy


class GSPMDData(Strategy):
    name = "gspmd data"

    def __init__(self, config, model, mesh, tx):
        super().__init__(config, model, mesh, tx)
        self.replicated = NamedSharding(mesh, P())
        self.rows = NamedSharding(mesh, P(axes.batch_axes(dict(mesh.shape))))
        self.shapes = jax.eval_shape(functools.partial(init_state, model, tx), jax.random.key(0))
        self._train = None
        self._eval = jax.jit(self._sums)

    # -- state: replicated, already canonical (Strategy.init_state places the model's
    # initial state with `place`) ----------------------------------------------------------
    def place(self, host_state):
        return jax.device_put(host_state, self.replicated)

    def canonical(self, state):
        return state

    def canonical_shapes(self):
        return self.shapes

    def state_shapes(self):
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.replicated),
            self.shapes,
        )

    # -- batches: rows split over the batch axes ---------------------------------------------------
    def put_batch(self, local_batch):
        return {
            k: jax.make_array_from_process_local_data(self.rows, v) for k, v in local_batch.items()
        }

    def batch_shapes(self, batch_size, eval=False):
        keys = {
            "image": ((batch_size, *self.model.input_shape), jnp.float32),
            "label": ((batch_size,), jnp.int32),
        }
        if eval:
            keys["mask"] = ((batch_size,), jnp.float32)
        return {k: jax.ShapeDtypeStruct(s, d, sharding=self.rows) for k, (s, d) in keys.items()}

    # -- steps -----------------------------------------------------------------------------
    def _step(self, state, batch):
        loss, stats, accuracy, grads = loss_and_grads(
            self.model, state.params, state.batch_stats, batch
        )
        new = state.apply_gradients(self.tx, grads, batch_stats=stats)
        return new, {"loss": loss, "accuracy": accuracy}

    def _sums(self, state, batch):
        return eval_sums(self.model, state.params, state.batch_stats, batch)

    def _jit(self):
        return jax.jit(self._step, donate_argnums=0, out_shardings=(self.replicated, None))

    def _compile(self, state, batch):
        self._train = self._jit().lower(state, batch).compile()

    def train_step(self, state, batch):
        if self._train is None:
            self.compile(state, batch)
        return self._train(state, batch)

    def eval_step(self, state, batch):
        return self.inflight.add(self._eval(state, batch))

    def programs(self, batch_shapes):
        args = (self.state_shapes(), batch_shapes)
        return [Program("step", "train step", 0, 0, self.mesh, 1, args, self._jit().lower(*args))]
