"""`allreduce`: one all-reduce of the gradient per step, then the same update on every replica
(tf_cnn_benchmarks' "replicated" variables). The baseline every other mode is compared with.
"""

from __future__ import annotations

from jaxpar.parallel.sync.base import SyncRule


def average_gradients(grads, replicas):
    """Mean of per-replica gradients: one all-reduce of the parameter bytes over "data"."""
    return replicas.pmean(grads)


class AllReduce(SyncRule):
    name = "allreduce"
    impls = ("shard_map", "pmap")

    def update(self, state, grads, stats):
        grads = average_gradients(grads, self.replicas)
        return state.apply_gradients(self.tx, grads, batch_stats=self.shared_stats(stats))
