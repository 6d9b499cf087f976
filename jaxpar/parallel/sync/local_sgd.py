"""`local_sgd` (periodic parameter averaging, Su et al. 2015) and `independent` (no
communication at all, tf_cnn_benchmarks' upper bound on throughput).

Each replica trains its own copy on its own share of every global batch: its own gradient,
its own optimizer step. Under `local_sgd`, after every `sync.period` steps (when the step
count reaches a multiple of the period) the parameters are averaged with one all-reduce
(inside a `lax.cond`, so the compiled step holds exactly one parameter all-reduce, executed
once per period). `independent` never averages.

At an average:
- BatchNorm running statistics are averaged with the parameters (same all-reduce). During the
  period each replica normalises with its own batch: these modes need sync.batch_norm=local.
- The optimizer state (momentum, Adam moments) stays local by default
  (`sync.opt_state_at_average=local`, as in Lin et al.'s "Don't use large mini-batches, use
  local SGD"); `average` averages it too, at the cost of a second all-reduce of its bytes.
With `period=1` and plain SGD the average of the replicas' updates is exactly the all-reduce
step. Per-step metrics come back per replica and are averaged outside the step.

Layout and canonical form: parameters, batch statistics and optimizer state carry a leading
replica axis split over "data"; checkpoints store every replica, so a resume in the middle of
a period is exact.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxpar.parallel.sync.base import AXIS, SyncRule, block, stack, stacked_specs, unblock


class Independent(SyncRule):
    name = "independent"
    eval_kind = "each"
    per_replica_metrics = True

    @classmethod
    def check(cls, config, data):
        if config.model.batch_norm and config.sync.batch_norm == "global":
            return (f"sync.mode={cls.name} trains replicas apart, so BatchNorm cannot use "
                    "global statistics; set --config.sync.batch_norm=local")  # fmt: skip
        return None

    def from_shared(self, state):
        return state.replace(
            params=stack(state.params, self.n),
            batch_stats=stack(state.batch_stats, self.n),
            opt_state=stack(state.opt_state, self.n),
        )

    def specs(self, shapes):
        return (
            super()
            .specs(shapes)
            .replace(
                params=stacked_specs(shapes.params),
                batch_stats=stacked_specs(shapes.batch_stats),
                opt_state=stacked_specs(shapes.opt_state),
            )
        )

    def eval_model(self, state):
        return block((state.params, state.batch_stats))

    def local_step(self, state, batch):
        """One replica's own SGD step on its share; nothing leaves the device."""
        params, stats, opt_state = block((state.params, state.batch_stats, state.opt_state))
        loss, stats, accuracy, grads = self.local_grads(params, stats, batch)
        params, opt_state = self.apply(grads, opt_state, params)
        metrics = {"loss": loss[None], "accuracy": accuracy[None]}
        return params, stats, opt_state, metrics

    def step(self, state, batch):
        params, stats, opt_state, metrics = self.local_step(state, batch)
        return self._pack(state, params, stats, opt_state), metrics

    def _pack(self, state, params, stats, opt_state):
        return state.replace(step=state.step + 1, params=unblock(params),
                             batch_stats=unblock(stats), opt_state=unblock(opt_state))  # fmt: skip


class LocalSGD(Independent):
    name = "local_sgd"
    eval_kind = "average"

    def __init__(self, config, n, model, tx):
        super().__init__(config, n, model, tx)
        self.period = int(config.sync.period)
        self.average_opt_state = config.sync.opt_state_at_average == "average"

    @classmethod
    def check(cls, config, data):
        if config.sync.period < 1:
            return f"sync.period must be >= 1 (steps between averages), got {config.sync.period}"
        if config.sync.opt_state_at_average not in ("local", "average"):
            return (f"unknown sync.opt_state_at_average {config.sync.opt_state_at_average!r}; "
                    "choose local or average")  # fmt: skip
        return super().check(config, data)

    def average(self, tree):
        """One all-reduce over "data" of the float leaves (counters are equal already)."""
        floats = lambda x: jnp.issubdtype(x.dtype, jnp.floating)
        mean = lambda x: lax.pcast(lax.pmean(x, AXIS), AXIS, to="varying") if floats(x) else x
        return jax.tree.map(mean, tree)

    def eval_model(self, state):
        """The model the next average produces (the replicas' mean)."""
        return lax.pmean(super().eval_model(state), AXIS)

    def step(self, state, batch):
        params, stats, opt_state, metrics = self.local_step(state, batch)
        shared = (params, stats, opt_state) if self.average_opt_state else (params, stats)
        shared = lax.cond((state.step + 1) % self.period == 0, self.average, lambda t: t, shared)
        params, stats = shared[:2]
        opt_state = shared[2] if self.average_opt_state else opt_state
        return self._pack(state, params, stats, opt_state), metrics
