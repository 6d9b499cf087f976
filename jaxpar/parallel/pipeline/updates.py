"""The update programs of a pipeline chunk and the accumulation they read: a base of
chunks.ChunkPrograms (chunks.py builds and compiles them with the chunk's other programs).

- accumulate: a micro-batch's gradient added into the accumulator (in every backward) and,
  measuring the gradient noise scale, its squared norm beside it.
- update: the chunk's sync rule combines the accumulated gradients over the replicas and
  applies them, the only place replicas meet; measuring, it also returns the chunk's parts of
  the step's two squared norms.
- combine and apply_update: the update in two halves under an adapting rate (AdaScale), so
  that the runner can add the chunks' parts of the norms between them and hand every chunk
  the whole model's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxpar import adascale
from jaxpar.parallel import norms
from jaxpar.parallel.adapt import adapted_metrics
from jaxpar.parallel.sync.base import block, unblock


class UpdatePrograms:
    """The update programs' bodies: they use the chunk (`ck`: its sync rule, replicas,
    micro-batch count, whether it measures) and `in_layout` of chunks.ChunkPrograms."""

    def accumulate(self, acc, grads, sharded_sq=None):
        """The accumulator plus one micro-batch's gradient (this replica's, scaled by 1/M:
        the step's gradient is the micro-batches' mean), and when measuring plus the squared
        norm of the micro-batch's own mean gradient, M times that increment (under fsdp:
        `sharded_sq`, the probe's cotangent, for the sharded leaves)."""
        grads = self.in_layout(grads)
        add = lambda total: jax.tree.map(lambda a, g: a + g[None], total, grads)
        if not self.ck.measure:
            return add(acc)
        total, sq = acc
        if self.ck.gather is None:
            inc = norms.local_sq(grads)
        else:
            inc = sharded_sq + norms.local_sq(self.ck.gather.whole(grads))
        m = self.ck.num_microbatches
        return add(total), sq + (m * m) * inc[None]

    def update(self, state, acc):
        """The updated state and a zeroed accumulator; when measuring also the chunk's parts
        of the step's two squared norms (its mean over (micro-batch, replica) of their
        gradients' squared norms; its combined gradient's), each the same on every replica."""
        rule = self.ck.rule
        total, sq = acc if self.ck.measure else (acc, None)
        grads = self.in_layout(block(total))
        new, big = rule.update_measured(state, grads, rule.local_stats(state.batch_stats))
        zero = jax.tree.map(jnp.zeros_like, acc)
        if not self.ck.measure:
            return new, zero
        small = self.ck.replicas.pmean(block(sq) / self.ck.num_microbatches)
        return new, zero, (small, big)

    def combine(self, state, acc):
        """An adapting rate's first half of the update: the combined gradient (each replica's
        part, stacked over the replicas), a zeroed accumulator, and the chunk's parts of the
        step's two squared norms."""
        total, sq = acc
        combined, big = self.ck.rule.combine(state, self.in_layout(block(total)))
        small = self.ck.replicas.pmean(block(sq) / self.ck.num_microbatches)
        combined = unblock(self.ck.replicas.varying(combined))
        return combined, jax.tree.map(jnp.zeros_like, acc), (small, big)

    def apply_update(self, state, combined, norms_total):
        """The second half: the optimizer step on the combined gradient, given the whole
        model's two squared norms; also the adapting rate's gain, progress and rate."""
        rule = self.ck.rule
        small, big = norms_total
        noise = adascale.GradNoise(small, big, *self.ck.adapt)
        stats = rule.local_stats(state.batch_stats)
        new = rule.apply(state, block(combined), stats, noise)
        return new, adapted_metrics(rule.adapted(new))
