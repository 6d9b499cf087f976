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

from jaxpar.parallel import tensor
from jaxpar.parallel.common import Strategy, TrainState, eval_sums, forward_loss
from jaxpar.parallel.common import init_state as _init_state

AXIS = "data"


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


class DataParallel(Strategy):
    """shard_map data parallelism over "data", optionally with tensor parallelism: the state
    is replicated over "data" and split over "tensor" by the config's sharding rules."""

    name = "data"

    def __init__(self, config, model, mesh, tx):
        super().__init__(config, model, mesh, tx)
        self.batch_sharding = NamedSharding(mesh, P(AXIS))
        self.bn_axis_name = AXIS if config.sync.batch_norm == "global" else None
        self.tensor_parallel = mesh.shape["tensor"] > 1
        rules = tensor.rules_from(config)
        if self.tensor_parallel:
            self.name = "data+tensor" if mesh.shape[AXIS] > 1 else "tensor"
            tensor.check(model, rules, dict(mesh.shape))
        shapes = jax.eval_shape(functools.partial(_init_state, model, tx), jax.random.key(0))
        self.state_specs = (
            tensor.state_specs(shapes, model, rules)
            if self.tensor_parallel
            else jax.tree.map(lambda _: P(), shapes)
        )
        self.state_sharding = jax.tree.map(
            lambda s: NamedSharding(mesh, s), self.state_specs, is_leaf=lambda x: isinstance(x, P)
        )
        # Manual over "data" (explicit pmean); automatic (sharding rules) over "tensor".
        self.manual = frozenset({AXIS}) if self.tensor_parallel else frozenset()
        # With one data replica the step is plain SPMD under jit: XLA (0.10.2) refuses a
        # manual all-reduce over a size-1 axis next to automatic axes, and none is needed.
        self.spmd_only = self.tensor_parallel and mesh.shape[AXIS] == 1
        self.tp = (
            (tensor.constrain_fn(rules), self.state_specs.params) if self.tensor_parallel else None
        )

    def init_state(self, rng):
        """Create the state directly with its sharding: no host copy first."""
        init = functools.partial(_init_state, self.model, self.tx)
        return jax.jit(init, out_shardings=self.state_sharding)(rng)

    def place(self, host_state):
        return jax.device_put(host_state, self.state_sharding)

    def put_batch(self, local_batch):
        return {
            k: jax.make_array_from_process_local_data(self.batch_sharding, v)
            for k, v in local_batch.items()
        }

    def _body(self, state, batch):
        if self.spmd_only:
            return replica_step(self.model, self.tx, None, state, batch,
                                local_params=state.params, tp=self.tp, axis=None)  # fmt: skip
        local = lax.pcast(state.params, AXIS, to="varying")
        return replica_step(
            self.model, self.tx, self.bn_axis_name, state, batch, local_params=local, tp=self.tp
        )

    def _shard_map(self, fn, out_specs):
        if self.spmd_only:
            return fn
        return jax.shard_map(
            fn, mesh=self.mesh, in_specs=(P(), P(AXIS)), out_specs=out_specs,
            axis_names=self.manual,
        )  # fmt: skip

    def _jit_train(self):
        step = self._shard_map(self._body, (P(), P()))
        return jax.jit(step, donate_argnums=0, out_shardings=(self.state_sharding, None))

    def _jit_eval(self):
        constrain = self.tp[0] if self.tp else None

        def body(state, batch):
            sums = eval_sums(self.model, state.params, state.batch_stats, batch, constrain)
            return sums if self.spmd_only else lax.psum(sums, AXIS)

        return jax.jit(self._shard_map(body, P()))
