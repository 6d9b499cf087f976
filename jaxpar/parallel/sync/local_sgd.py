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
replica axis split over the replica axes (before their own split over "tensor", if any); checkpoints
store every replica, so a resume in the middle of a period is exact. On pipeline stages every
stage's replicas follow the rule for that stage's layers, all averaging at the same steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxpar.parallel.sync.base import SyncRule, block, stack, stacked, unblock


class Independent(SyncRule):
    name = "independent"
    eval_kind = "each"
    per_replica_metrics = True
    refuses_stages = (
        "every replica evaluates the whole eval set on its own, which a pipeline's "
        "micro-batched evaluation over the replicas' rows does not do"
    )

    @classmethod
    def check(cls, config, data):
        if config.model.batch_norm and config.sync.batch_norm == "global":
            return (
                f"sync.mode={cls.name} trains replicas apart, so BatchNorm cannot use "
                "global statistics; set --config.sync.batch_norm=local"
            )
        return None

    def from_shared(self, state):
        return state.replace(
            params=stack(state.params, self.num_replicas),
            batch_stats=stack(state.batch_stats, self.num_replicas),
            opt_state=stack(state.opt_state, self.num_replicas),
        )

    def specs(self, shapes):
        specs = super().specs(shapes)
        return specs.replace(
            params=stacked(specs.params, self.replicas),
            batch_stats=stacked(specs.batch_stats, self.replicas),
            opt_state=stacked(specs.opt_state, self.replicas),
        )

    def local_params(self, state):
        return block(state.params)

    def local_stats(self, stats):
        return block(stats)

    def placed_stats(self, stats):
        return unblock(stats)

    def eval_model(self, state):
        return block((state.params, state.batch_stats))

    def update(self, state, grads, stats):
        """This replica's own optimizer step (then, under local_sgd, the periodic average)."""
        mine = state.replace(params=block(state.params), opt_state=block(state.opt_state))
        new = mine.apply_gradients(self.tx, grads, batch_stats=stats)
        new = self.average_if_due(new)
        return new.replace(
            params=unblock(new.params),
            batch_stats=unblock(new.batch_stats),
            opt_state=unblock(new.opt_state),
        )

    def average_if_due(self, state):
        return state


class LocalSGD(Independent):
    name = "local_sgd"
    eval_kind = "average"
    refuses_stages = None

    def __init__(self, settings, replicas, tx, variable_specs):
        super().__init__(settings, replicas, tx, variable_specs)
        self.period = int(settings.period)
        self.average_opt_state = settings.opt_state_at_average == "average"

    @classmethod
    def check(cls, config, data):
        if config.sync.period < 1:
            return f"sync.period must be >= 1 (steps between averages), got {config.sync.period}"
        if config.sync.opt_state_at_average not in ("local", "average"):
            return (
                f"unknown sync.opt_state_at_average {config.sync.opt_state_at_average!r}; "
                "choose local or average"
            )
        return super().check(config, data)

    def average(self, tree):
        """One all-reduce over the replicas of the float leaves (counters are equal
        already)."""
        floats = lambda x: jnp.issubdtype(x.dtype, jnp.floating)
        mean = lambda x: self.replicas.varying(self.replicas.pmean(x)) if floats(x) else x
        return jax.tree.map(mean, tree)

    def eval_model(self, state):
        """The model the next average produces (the replicas' mean)."""
        return self.replicas.pmean(super().eval_model(state))

    def average_if_due(self, state):
        """`state.step` is already the new count: average when it reaches the period."""
        shared = (state.params, state.batch_stats)
        if self.average_opt_state:
            shared = (*shared, state.opt_state)
        shared = lax.cond(state.step % self.period == 0, self.average, lambda t: t, shared)
        state = state.replace(params=shared[0], batch_stats=shared[1])
        return state.replace(opt_state=shared[2]) if self.average_opt_state else state
