"""The residual programs of a pipeline chunk (`pipeline.remat=False`): the forward keeps the
backward's residuals instead of the backward recomputing the forward (chunks.py builds and
compiles them with the chunk's other programs).

- fwd_res: forward, layer by layer under `jax.vjp`; returns the pullbacks' residuals (the
  pullback of `jax.vjp` is a pytree: its leaves leave the program, its structure stays on the
  host). Residuals that are the parameters themselves are not stored: the backward gets the
  parameters anyway. The last chunk's fwd_res also takes the labels and returns the loss.
- bwd_res: the whole backward from the residuals, no forward recomputed.
- bwd_in (zero-bubble B): the input gradient only, keeping each layer's output gradient.
- bwd_w (zero-bubble W): each layer's parameter gradient from its residuals and its output
  gradient, into the accumulator. XLA drops the half of each layer's pullback a program does
  not return, so B and W together cost one backward.

Inside shard_map every residual keeps its varying-ness over the replica axes (what the
pullback was traced with): a leaf varying over some of them leaves the program stacked along
those (P(axes)), an invariant one replicated. Which is which is read by tracing the forward
once abstractly before compiling it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


class ResidualPrograms:
    """The residual programs' bodies, a base of chunks.ChunkPrograms: they use its chunk
    (`ck`), its layers (`layer_ids`, `names`, `inv_m`) and its helpers (`local`, `apply`,
    `probe`, `loss`, `boundary`, `accumulate`), and set `residuals` and `loss_dtype`."""

    def fwd_res(self, state, x, *target):
        """Forward layer by layer under vjp; returns (output or (loss, accuracy)), the new
        statistics, and the stored residual leaves."""
        local, stats = self.local(state)
        new_stats = dict(stats)
        pullbacks = []
        probe = self.probe()
        for i, name in zip(self.layer_ids, self.names):
            sub = {name: stats[name]} if name in stats else {}

            def f(p, x, probe, i=i, name=name, sub=sub):
                return self.apply({name: p}, sub, x, slice(i, i + 1), probe=probe)

            x, pullback, layer_stats = jax.vjp(f, local[name], x, probe, has_aux=True)
            new_stats.update(layer_stats)
            pullbacks.append(pullback)
        r = self.ck.replicas
        if self.ck.last:
            loss, pullback, correct = jax.vjp(lambda y: self.loss(y, *target), x, has_aux=True)
            pullbacks.append(pullback)
            self.loss_dtype = loss.dtype  # the backward's cotangent takes it (float64 runs)
            out = (r.pmean(loss), r.pmean(correct))
        else:
            out = self.boundary(x)
        leaves, treedef = jax.tree.flatten(pullbacks)
        param_pos = {id(p): j for j, p in enumerate(jax.tree.leaves(local))}
        kinds, stored = [], []
        for leaf in leaves:
            if id(leaf) in param_pos:
                kinds.append(("param", param_pos[id(leaf)]))
                continue
            along = (
                tuple(a for a in r.axes if a in jax.typeof(leaf).mat.varying) if r.manual else ()
            )
            kinds.append(("stored", along))
            stored.append(leaf[None] if along else leaf)
        self.residuals = (treedef, tuple(kinds))
        return out, self.ck.rule.placed_stats(new_stats), stored

    def stored_specs(self) -> list:
        return [P(along) if along else P() for kind, along in self.residuals[1] if kind == "stored"]

    def pullbacks(self, state, stored):
        treedef, kinds = self.residuals
        param_leaves = jax.tree.leaves(self.ck.rule.local_params(state))
        it = iter(stored)
        leaves = []
        for kind, arg in kinds:
            if kind == "param":
                leaves.append(param_leaves[arg])
            else:
                leaf = next(it)
                leaves.append(leaf[0] if arg else leaf)
        return jax.tree.unflatten(treedef, leaves)

    def _walk(self, state, stored, cot):
        """Backward through the chunk's layers from the residuals: the input gradient, each
        layer's output gradient, the parameter gradients and (fsdp, measuring) the probe's
        cotangents' sum (the last two dropped by XLA where unused)."""
        pullbacks = self.pullbacks(state, stored)
        if self.ck.last:  # the loss's pullback, with d(step loss)/d(micro-batch loss) = 1/M
            one = jnp.asarray(self.inv_m, self.loss_dtype)
            (cot,) = pullbacks.pop()(self.ck.replicas.varying(one))
        grads, outs, sharded = {}, [], []
        for name, pullback in reversed(list(zip(self.names, pullbacks))):
            outs.insert(0, cot)
            g_params, cot, sq = pullback(cot)
            grads[name] = g_params
            sharded.append(sq)
        return cot, outs, grads, _total(sharded)

    def bwd_res(self, state, stored, *cot_acc):
        *cot, acc = cot_acc
        g_x, _, grads, sharded_sq = self._walk(state, stored, cot[0] if cot else None)
        acc = self.accumulate(acc, grads, sharded_sq)
        return acc if self.ck.first else (self.boundary(g_x), acc)

    def bwd_in(self, state, stored, *cot):
        g_x, outs, _, _ = self._walk(state, stored, cot[0] if cot else None)
        return outs if self.ck.first else (self.boundary(g_x), outs)

    def bwd_w(self, state, stored, outs, acc):
        pullbacks = self.pullbacks(state, stored)
        parts = [pb(g) for pb, g in zip(pullbacks, outs)]
        grads = {name: part[0] for name, part in zip(self.names, parts)}
        return self.accumulate(acc, grads, _total([part[2] for part in parts]))


def _total(parts: list):
    """The probes' cotangents added (None where the chunk has no probe)."""
    return None if any(p is None for p in parts) else sum(parts)
