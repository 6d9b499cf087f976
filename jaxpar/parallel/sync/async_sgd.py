"""`async`: asynchronous SGD with stale gradients, simulated deterministically.

Replica r's gradient is applied d_r global updates after the parameters it was computed from,
with the delays spread evenly from 0 to `sync.max_staleness` = S over the replicas:
d_r = round(r * S / (N - 1)) (N = 4, S = 8: delays 0, 3, 5, 8). Each step every replica
computes a gradient at the current parameters, pushes it into its own queue of the last S
gradients, and hands over the one computed d_r steps ago (zero while none exists yet, in the
first d_r steps). The step's update is the mean of those N arriving gradients, one all-reduce,
applied with the optimizer on every replica as under `allreduce`. With
`sync.staleness_aware_lr=True` each arriving gradient is divided by max(d_r, 1) first: Zhang et
al.'s (2016) staleness-dependent learning rate lr / staleness (exact for SGD with or without
momentum, where scaling a gradient scales its step; under Adam it rescales the gradient fed to
the moments). S = 0 is `allreduce`.

This simulates asynchrony on a synchronous runtime: it reproduces the optimisation effect of
stale gradients (bounded, fixed staleness per replica) but every step still waits for every
replica, so it shows none of asynchrony's speed-up from not waiting for stragglers, and its
staleness pattern is fixed where real delays vary from step to step.

Layout and canonical form: the model state is replicated (the single-device state); the
pending gradients, `state.sync["pending"]` of shape [N, S, *param], are split over the replica axes,
one queue per device, and checkpointed, so a resume with gradients in flight is exact.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxpar.mesh import is_spec
from jaxpar.parallel.sync.base import SyncRule, block, unblock


def delays(n: int, max_staleness: int) -> list[int]:
    """Replica r's fixed staleness, spread evenly over 0..max_staleness."""
    if n == 1:
        return [0]
    return [(r * max_staleness + (n - 1) // 2) // (n - 1) for r in range(n)]


class Async(SyncRule):
    name = "async"

    def __init__(self, settings, replicas, tx, variable_specs):
        super().__init__(settings, replicas, tx, variable_specs)
        self.depth = int(settings.max_staleness)
        self.delays = delays(self.num_replicas, self.depth)
        self.aware = bool(settings.staleness_aware_lr)

    @classmethod
    def check(cls, config, data):
        if config.sync.max_staleness < 0:
            return f"sync.max_staleness must be >= 0, got {config.sync.max_staleness}"
        return None

    def from_shared(self, state):
        if not self.depth:
            return state
        queue = lambda p: jnp.zeros((self.num_replicas, self.depth, *p.shape), p.dtype)
        return state.replace(sync={"pending": jax.tree.map(queue, state.params)})

    def specs(self, shapes):
        specs = super().specs(shapes)
        if not self.depth:
            return specs
        lead = self.replicas.axes or None
        queues = jax.tree.map(
            lambda s: P(lead, None, *s), self.variable_specs["params"], is_leaf=is_spec
        )
        return specs.replace(sync={"pending": queues})

    def update(self, state, grads, stats):
        sync = state.sync
        if self.depth:
            delay = jnp.asarray(self.delays)[self.replicas.index()]
            queue = block(sync["pending"])  # [S, *param]: queue[k] was computed k + 1 steps ago
            both = jax.tree.map(lambda g, q: jnp.concatenate([g[None], q]), grads, queue)
            grads = jax.tree.map(lambda b: b[delay], both)  # the gradient arriving now
            sync = {"pending": unblock(jax.tree.map(lambda b: b[: self.depth], both))}
            if self.aware:
                scale = 1.0 / jnp.maximum(delay, 1).astype(jnp.float32)
                grads = jax.tree.map(lambda g: g * scale, grads)
        return state.apply_gradients(
            self.tx, self.replicas.pmean(grads), batch_stats=self.shared_stats(stats), sync=sync
        )
