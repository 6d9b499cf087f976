"""`allreduce`: one all-reduce of the gradient per step, then the same update on every replica
(tf_cnn_benchmarks' "replicated" variables). The baseline every other mode is compared with.
"""

from __future__ import annotations

from jaxpar.parallel import norms
from jaxpar.parallel.sync.base import SyncRule


def average_gradients(grads, replicas, specs=None):
    """Mean of per-replica gradients: one all-reduce of the parameter bytes over the replica
    axes (node x data: reduce-scatter, all-reduce across nodes, all-gather; a leaf split over
    fsdp: over the other replica axes only, Replicas.mean_grads)."""
    return replicas.mean_grads(grads, specs)


class AllReduce(SyncRule):
    name = "allreduce"
    impls = ("shard_map", "pmap")
    combines = True

    def combine(self, state, grads):
        specs = self.variable_specs["params"]
        grads = average_gradients(grads, self.replicas, specs)
        return grads, norms.sq_norm(grads, specs, self.manual_axes)

    def apply(self, state, combined, stats, noise=None):
        return state.apply_gradients(self.tx, combined, noise, batch_stats=self.shared_stats(stats))
