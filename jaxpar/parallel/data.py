"""Data parallelism with jax.shard_map over the "data" axis and explicit gradient averaging.

Every device holds a full replica of the state and a 1/d slice of the global batch. Inside the
step the replicated parameters are cast to per-device ("varying") values, so each device's
gradient stays local, and `average_gradients` then runs exactly one all-reduce of the
parameter bytes. (Without the cast, shard_map's check_vma would already sum the gradient of a
replicated parameter over "data", and a pmean on top would return d times the true gradient.)
"""

from __future__ import annotations

import functools

import jax
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar.parallel.common import Strategy, TrainState, eval_sums, forward_loss
from jaxpar.parallel.common import init_state as _init_state

AXIS = "data"


def average_gradients(grads, axis: str = AXIS):
    """Mean of per-replica gradients: one all-reduce of the parameter bytes over `axis`."""
    return lax.pmean(grads, axis)


def replica_step(model, tx, bn_axis_name, state: TrainState, batch: dict, *, local_params):
    """The per-replica body shared by shard_map and pmap: local grads, then averaged.

    `local_params` are the parameters the gradient is taken at; they must be per-replica
    values (not replicated) so that `average_gradients` is the only reduction.
    """
    grad_fn = jax.value_and_grad(
        functools.partial(forward_loss, model, bn_axis_name=bn_axis_name), has_aux=True
    )
    (loss, (stats, accuracy)), grads = grad_fn(local_params, state.batch_stats, batch)
    grads = average_gradients(grads)
    if bn_axis_name is None and stats:
        stats = lax.pmean(stats, AXIS)  # per-replica BN: keep the running averages in step
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_state = state.replace(
        step=state.step + 1,
        params=optax.apply_updates(state.params, updates),
        batch_stats=stats,
        opt_state=opt_state,
    )
    metrics = {"loss": lax.pmean(loss, AXIS), "accuracy": lax.pmean(accuracy, AXIS)}
    return new_state, metrics


class DataParallel(Strategy):
    """shard_map data parallelism: replicated state, batch split over "data"."""

    name = "data"

    def __init__(self, config, model, mesh, tx):
        super().__init__(config, model, mesh, tx)
        self.replicated = NamedSharding(mesh, P())
        self.batch_sharding = NamedSharding(mesh, P(AXIS))
        self.bn_axis_name = AXIS if config.sync.batch_norm == "global" else None

    def init_state(self, rng):
        """Create the state directly with its (replicated) sharding: no host copy first."""
        init = functools.partial(_init_state, self.model, self.tx)
        return jax.jit(init, out_shardings=self.replicated)(rng)

    def put_batch(self, local_batch):
        return {
            k: jax.make_array_from_process_local_data(self.batch_sharding, v)
            for k, v in local_batch.items()
        }

    def _body(self, state, batch):
        local = lax.pcast(state.params, AXIS, to="varying")
        return replica_step(
            self.model, self.tx, self.bn_axis_name, state, batch, local_params=local
        )

    def _jit_train(self):
        step = jax.shard_map(
            self._body, mesh=self.mesh, in_specs=(P(), P(AXIS)), out_specs=(P(), P())
        )
        return jax.jit(step, donate_argnums=0)

    def _jit_eval(self):
        def body(state, batch):
            sums = eval_sums(self.model, state.params, state.batch_stats, batch)
            return lax.psum(sums, AXIS)

        return jax.jit(jax.shard_map(body, mesh=self.mesh, in_specs=(P(), P(AXIS)), out_specs=P()))
