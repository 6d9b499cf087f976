"""`allreduce`: one all-reduce of the gradient per step, then the same update on every replica
(tf_cnn_benchmarks' "replicated" variables). The baseline every other mode is compared with.
"""

from __future__ import annotations

from jaxpar.parallel.sync.base import SyncRule


def average_gradients(grads, replicas, specs=None):
    """Mean of per-replica gradients: one all-reduce of the parameter bytes over the replica
    axes (node x data: reduce-scatter, all-reduce across nodes, all-gather; a leaf split over
    fsdp: over the other replica axes only, Replicas.mean_grads)."""
    return replicas.mean_grads(grads, specs)


class AllReduce(SyncRule):
    name = "allreduce"
    impls = ("shard_map", "pmap")

    def update(self, state, grads, stats):
        grads = average_gradients(grads, self.replicas, self.variable_specs["params"])
        return state.apply_gradients(self.tx, grads, batch_stats=self.shared_stats(stats))
