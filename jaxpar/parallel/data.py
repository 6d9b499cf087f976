"""Data parallelism with jax.shard_map over the "data" axis; how replicas agree is a
pluggable synchronisation rule (`sync.mode`, jaxpar/parallel/sync/).

Every device holds a replica (or, by the rule, a slice) of the state and a 1/d slice of the
global batch. Under the default `allreduce` rule the replicated parameters are cast to
per-device ("varying") values inside the step, so each device's gradient stays local, and
`average_gradients` then runs exactly one all-reduce of the parameter bytes. (Without the
cast, shard_map's check_vma would already sum the gradient of a replicated parameter over
"data", and a pmean on top would return d times the true gradient.)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar.config import ConfigError
from jaxpar.parallel import sync, tensor
from jaxpar.parallel.common import Strategy, eval_sums
from jaxpar.parallel.common import init_state as _init_state
from jaxpar.parallel.sync import AXIS, average_gradients, replica_step

__all__ = ["AXIS", "DataParallel", "average_gradients", "replica_step"]


class DataParallel(Strategy):
    """shard_map data parallelism over "data", optionally with tensor parallelism: the state
    is laid out over "data" by the sync rule and split over "tensor" by the sharding rules."""

    name = "data"

    def __init__(self, config, model, mesh, tx):
        super().__init__(config, model, mesh, tx)
        self.batch_sharding = NamedSharding(mesh, P(AXIS))
        self.bn_axis_name = AXIS if config.sync.batch_norm == "global" else None
        self.tensor_parallel = mesh.shape["tensor"] > 1
        self.rule = sync.build(config, mesh.shape[AXIS], model, tx)
        if config.sync.mode != "allreduce":
            self.name = f"data ({config.sync.mode})"
        rules = tensor.rules_from(config)
        if self.tensor_parallel:
            self.name = "data+tensor" if mesh.shape[AXIS] > 1 else "tensor"
            tensor.check(model, rules, dict(mesh.shape))
        shapes = jax.eval_shape(functools.partial(_init_state, model, tx), jax.random.key(0))
        self.canonical_shapes = jax.eval_shape(self.rule.from_shared, shapes)
        if self.tensor_parallel:  # allreduce only (config validation refuses other modes)
            self.state_specs = tensor.state_specs(shapes, model, rules)
        else:
            self.state_specs = self.rule.specs(
                jax.eval_shape(self.rule.to_device, self.canonical_shapes)
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
        self._to_canonical = jax.jit(self.rule.canonical)
        self._replica_mean = jax.jit(lambda m: jax.tree.map(jnp.mean, m))

    def init_state(self, rng):
        """Create the state directly with its sharding: no host copy first."""

        def init(rng):
            return self.rule.to_device(self.rule.from_shared(_init_state(self.model, self.tx, rng)))

        return jax.jit(init, out_shardings=self.state_sharding)(rng)

    def host_target(self):
        return jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), self.canonical_shapes)

    def place(self, host_state):
        host_state = self._fit(host_state)
        if self.rule.name == "allreduce":
            return jax.device_put(host_state, self.state_sharding)
        return jax.jit(self.rule.to_device, out_shardings=self.state_sharding)(host_state)

    def _fit(self, host_state):
        """A canonical state of another run, if it fits this mode: one shared model starts
        per-replica modes on every replica. Anything else is a one-line error."""
        shape_of = lambda t: jax.tree.map(lambda x: tuple(np.shape(x)), t)
        want = shape_of(self.canonical_shapes)
        if shape_of(host_state) == want:
            return host_state
        shared = host_state.replace(sync={})
        if (
            self.rule.name != "allreduce"
            and shape_of(jax.eval_shape(self.rule.from_shared, shared)) == want
        ):
            return jax.tree.map(np.asarray, self.rule.from_shared(shared))
        raise ConfigError(
            f"the checkpoint's state does not fit sync.mode={self.config.sync.mode} with "
            f"{self.mesh.shape[AXIS]} replicas (it was written by another mode or replica "
            "count); resume with the settings it was written with"
        )

    def canonical(self, state):
        if self.rule.name == "allreduce":
            return state
        return self._to_canonical(state)

    def put_batch(self, local_batch):
        return {
            k: jax.make_array_from_process_local_data(self.batch_sharding, v)
            for k, v in local_batch.items()
        }

    def train_step(self, state, batch):
        state, metrics = super().train_step(state, batch)
        if self.rule.per_replica_metrics:  # [replicas] values: averaged outside the step
            metrics = self._replica_mean(metrics)
        return state, metrics

    def _body(self, state, batch):
        if self.spmd_only:
            return replica_step(self.model, self.tx, None, state, batch,
                                local_params=state.params, tp=self.tp, axis=None)  # fmt: skip
        if self.tensor_parallel:
            local = lax.pcast(state.params, AXIS, to="varying")
            return replica_step(self.model, self.tx, self.bn_axis_name, state, batch,
                                local_params=local, tp=self.tp)  # fmt: skip
        return self.rule.step(state, batch)

    def _shard_map(self, fn, out_specs, state_specs=None):
        if self.spmd_only:
            return fn
        return jax.shard_map(
            fn, mesh=self.mesh, in_specs=(P() if state_specs is None else state_specs, P(AXIS)), out_specs=out_specs,
            axis_names=self.manual,
        )  # fmt: skip

    def _jit_train(self):
        metric_spec = P(AXIS) if self.rule.per_replica_metrics else P()
        if self.tensor_parallel:
            step = self._shard_map(self._body, (P(), P()))
        else:
            step = self._shard_map(self._body, (self.state_specs, metric_spec), self.state_specs)
        return jax.jit(step, donate_argnums=0, out_shardings=(self.state_sharding, None))

    def _jit_eval(self):
        constrain = self.tp[0] if self.tp else None
        kind = self.rule.eval_kind

        def body(state, batch):
            if self.tensor_parallel:
                params, stats = state.params, state.batch_stats
            else:
                params, stats = self.rule.eval_model(state)
            if kind == "each":  # independent: every replica evaluates the whole batch
                batch = lax.all_gather(batch, AXIS, tiled=True)
                sums = eval_sums(self.model, params, stats, batch)
                return jax.tree.map(lambda x: x[None], sums)
            sums = eval_sums(self.model, params, stats, batch, constrain)
            return sums if self.spmd_only else lax.psum(sums, AXIS)

        if self.tensor_parallel or self.spmd_only:
            return jax.jit(self._shard_map(body, P()))
        out = P(AXIS) if kind == "each" else P()
        fn = jax.jit(self._shard_map(body, out, self.state_specs))
        if kind != "each":
            return fn

        @jax.jit  # one computation (dispatch.py counts computations)
        def replica_zero_and_spread(state, batch):
            sums = fn(state, batch)
            return {**{k: v[0] for k, v in sums.items()}, "replica_correct": sums["correct"]}

        return replica_zero_and_spread
