"""`allreduce`: one all-reduce of the gradient per step, then the same update on every replica
(tf_cnn_benchmarks' "replicated" variables). The baseline every other mode is compared with.
"""

from __future__ import annotations

import functools

import jax
import optax
from jax import lax

from jaxpar.parallel import tensor
from jaxpar.parallel.common import TrainState, forward_loss
from jaxpar.parallel.sync.base import AXIS, SyncRule, varying


def average_gradients(grads, axis: str = AXIS):
    """Mean of per-replica gradients: one all-reduce of the parameter bytes over `axis`."""
    return lax.pmean(grads, axis)


def replica_step(
    model, tx, bn_axis_name, state: TrainState, batch: dict, *, local_params, tp=None, axis=AXIS
):
    """The per-replica body shared by shard_map and pmap: local grads, then averaged.

    `local_params` are the parameters the gradient is taken at; they must be per-replica
    values (not replicated) so that `average_gradients` is the only reduction.
    `tp`: (constrain, param specs) under tensor parallelism; gradients are pinned to their
    parameters' layout. `axis=None`: one replica under plain jit, nothing to average.
    """
    mean = (lambda x: lax.pmean(x, axis)) if axis else (lambda x: x)
    constrain, param_specs = tp or (None, None)
    grad_fn = jax.value_and_grad(
        functools.partial(forward_loss, model, bn_axis_name=bn_axis_name, constrain=constrain),
        has_aux=True,
    )
    (loss, (stats, accuracy)), grads = grad_fn(local_params, state.batch_stats, batch)
    grads = average_gradients(grads, axis) if axis else grads
    if param_specs is not None:  # keep the update in the parameters' layout
        grads = tensor.constrain_tree(grads, param_specs)
    if bn_axis_name is None and stats:
        stats = mean(stats)  # per-replica BN: keep the running averages in step
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_state = state.replace(
        step=state.step + 1,
        params=optax.apply_updates(state.params, updates),
        batch_stats=stats,
        opt_state=opt_state,
    )
    metrics = {"loss": mean(loss), "accuracy": mean(accuracy)}
    return new_state, metrics


class AllReduce(SyncRule):
    name = "allreduce"
    impls = ("shard_map", "pmap")
    allows_tensor = True
    allows_stages = True

    def step(self, state, batch):
        return replica_step(self.model, self.tx, self.bn_axis_name, state, batch,
                            local_params=varying(state.params))  # fmt: skip
