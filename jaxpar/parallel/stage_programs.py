"""The compiled programs of each pipeline chunk (a contiguous run of layers on one stage's devices).

Per chunk: forward, backward, update and eval, and (`pipeline.remat=False`) the programs that
keep the backward's residuals instead of recomputing the forward:

- fwd: forward only (`remat=True`: its backward recomputes it from the stored input).
- bwd: recompute the forward from the stored input, then vjp: input gradient, and parameter
  gradients added into the accumulator.
- fwd_res: forward, layer by layer under `jax.vjp`; returns the pullbacks' residuals (the
  pullback of `jax.vjp` is a pytree: its leaves leave the program, its structure stays on the
  host). Residuals that are the parameters themselves are not stored: the backward gets the
  parameters anyway. The last chunk's fwd_res also takes the labels and returns the loss.
- bwd_res: the whole backward from the residuals, no forward recomputed.
- bwd_in (zero-bubble B): the input gradient only, keeping each layer's output gradient.
- bwd_w (zero-bubble W): each layer's parameter gradient from its residuals and its output
  gradient, into the accumulator. XLA drops the half of each layer's pullback a program does
  not return, so B and W together cost one backward.

Inside shard_map every residual keeps its varying-ness over "data" (what the pullback was traced
with): varying leaves leave the program stacked per replica (P(data)), invariant ones replicated.
Which is which is read by tracing the forward once abstractly before compiling it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxpar.parallel import tensor
from jaxpar.parallel.common import logit_sums
from jaxpar.parallel.data import AXIS, average_gradients

NAMES = ("fwd", "bwd", "update", "eval", "fwd_res", "bwd_res", "bwd_in", "bwd_w")


class OnMesh:
    """A jitted stage program that traces, lowers and runs with its stage's mesh as the
    context mesh, so the sharding rules inside resolve against that stage's devices."""

    def __init__(self, fn, mesh):
        self.fn, self.mesh = fn, mesh

    def __call__(self, *args):
        with jax.set_mesh(self.mesh):
            return self.fn(*args)

    def lower(self, *args):
        with jax.set_mesh(self.mesh):
            return self.fn.lower(*args)


class Deferred:
    """A program built on its first call or lowering from the arguments' shapes: residual
    programs learn their residuals' structure only by tracing the chunk's forward."""

    def __init__(self, make):
        self.make, self.program = make, None

    def _get(self, args):
        if self.program is None:
            self.program = self.make(args)
        return self.program

    def __call__(self, *args):
        return self._get(args)(*args)

    def lower(self, *args):
        return self._get(args).lower(*args)


def build(pipe) -> dict[str, list]:
    """Programs per chunk of `pipe` (a Pipeline), keyed by NAMES."""
    progs: dict[str, list] = {name: [] for name in NAMES}
    for c in range(pipe.num_chunks):
        for name, program in _Chunk(pipe, c).programs().items():
            progs[name].append(program)
    return progs


class _Chunk:
    def __init__(self, pipe, c: int):
        self.pipe, self.c = pipe, c
        self.mesh = pipe.meshes[c % pipe.num_stages]
        self.last, self.first = c == pipe.num_chunks - 1, c == 0
        self.layer_ids = range(len(pipe.model.layers))[pipe.layers[c]]
        self.names = [pipe.model.layers[i].name for i in self.layer_ids]
        self.inv_m = 1.0 / pipe.num_microbatches
        self.bn_axis = None if pipe.spmd_only else pipe.bn_axis_name
        self.residuals: tuple | None = None  # (treedef, kinds), set when fwd_res is traced

    # -- helpers ------------------------------------------------------------------------

    def pmean(self, x):
        return x if self.pipe.spmd_only else lax.pmean(x, AXIS)

    def varying(self, x):
        return x if self.pipe.spmd_only else lax.pcast(x, AXIS, to="varying")

    def sync_stats(self, stats):
        return stats if self.pipe.bn_axis_name or not stats else self.pmean(stats)

    def apply(self, params, stats, x, layers, train=True):
        return self.pipe.model.apply(
            params, stats, x, train=train, layers=layers,
            bn_axis_name=self.bn_axis if train else None, constrain=self.pipe.constrain,
        )  # fmt: skip

    def loss(self, y, target):
        loss = optax.softmax_cross_entropy_with_integer_labels(y, target).mean()
        return loss, jnp.mean(jnp.argmax(y, -1) == target)

    def accumulate(self, acc, grads):
        if self.pipe.tensor_parallel:  # accumulate in the parameters' layout
            grads = tensor.constrain_tree(grads, self.pipe.state_specs[self.c].params)
        return jax.tree.map(lambda a, g: a + g[None], acc, grads)

    def sm(self, fn, in_specs, out_specs):
        if self.pipe.spmd_only:
            return fn
        manual = frozenset({AXIS}) if self.pipe.tensor_parallel else frozenset()
        return jax.shard_map(fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs,
                             axis_names=manual)  # fmt: skip

    def on(self, fn, **jit_kwargs):
        return OnMesh(jax.jit(fn, **jit_kwargs), self.mesh)

    # -- recomputing programs (remat=True) and the rest ---------------------------------

    def fwd(self, params, stats, x):
        y, new_stats = self.apply(params, stats, x, self.pipe.layers[self.c])
        return y, self.sync_stats(new_stats)

    def bwd(self, params, stats, x, target, acc):
        def f(p, x):
            y, new_stats = self.apply(p, stats, x, self.pipe.layers[self.c])
            if not self.last:
                return y, new_stats
            loss, correct = self.loss(y, target)
            return loss, (new_stats, correct)

        out, vjp, aux = jax.vjp(f, self.varying(params), x, has_aux=True)
        # d(step loss)/d(micro-batch loss) = 1/M; the local loss is per replica.
        cot = self.varying(jnp.asarray(self.inv_m, out.dtype)) if self.last else target
        g_params, g_x = vjp(cot)
        acc = self.accumulate(acc, g_params)
        if self.last:
            new_stats, correct = aux
            metrics = (self.pmean(out), self.pmean(correct))
            return g_x, acc, self.sync_stats(new_stats), metrics
        return (g_x, acc) if not self.first else acc

    def update(self, state, acc):
        grads = jax.tree.map(lambda a: a[0], acc)
        grads = grads if self.pipe.spmd_only else average_gradients(grads)
        if self.pipe.tensor_parallel:  # keep the update in the parameters' layout
            grads = tensor.constrain_tree(grads, self.pipe.state_specs[self.c].params)
        updates, opt_state = self.pipe.tx.update(grads, state.opt_state, state.params)
        new = state.replace(
            step=state.step + 1, opt_state=opt_state,
            params=optax.apply_updates(state.params, updates),
        )  # fmt: skip
        return new, jax.tree.map(jnp.zeros_like, acc)

    def evaluate(self, params, stats, x, *label_mask):
        y, _ = self.apply(params, stats, x, self.pipe.layers[self.c], train=False)
        if not label_mask:
            return y
        sums = logit_sums(y, *label_mask)
        return sums if self.pipe.spmd_only else lax.psum(sums, AXIS)

    # -- residual programs (remat=False) ------------------------------------------------

    def fwd_res(self, params, stats, x, *target):
        """Forward layer by layer under vjp; returns (output or (loss, accuracy)), the new
        statistics, and the stored residual leaves."""
        local = self.varying(params)
        new_stats = dict(stats)
        pullbacks = []
        for i, name in zip(self.layer_ids, self.names):
            sub = {name: stats[name]} if name in stats else {}

            def f(p, x, i=i, name=name, sub=sub):
                return self.apply({name: p}, sub, x, slice(i, i + 1))

            x, pullback, layer_stats = jax.vjp(f, local[name], x, has_aux=True)
            new_stats.update(layer_stats)
            pullbacks.append(pullback)
        if self.last:
            loss, pullback, correct = jax.vjp(lambda y: self.loss(y, *target), x, has_aux=True)
            pullbacks.append(pullback)
            out = (self.pmean(loss), self.pmean(correct))
        else:
            out = x
        leaves, treedef = jax.tree.flatten(pullbacks)
        param_pos = {id(p): j for j, p in enumerate(jax.tree.leaves(local))}
        kinds, stored = [], []
        for leaf in leaves:
            if id(leaf) in param_pos:
                kinds.append(("param", param_pos[id(leaf)]))
                continue
            stacked = not self.pipe.spmd_only and AXIS in jax.typeof(leaf).mat.varying
            kinds.append(("stored", stacked))
            stored.append(leaf[None] if stacked else leaf)
        self.residuals = (treedef, tuple(kinds))
        return out, self.sync_stats(new_stats), stored

    def stored_specs(self) -> list:
        return [P(AXIS) if flag else P() for kind, flag in self.residuals[1] if kind == "stored"]

    def pullbacks(self, params, stored):
        treedef, kinds = self.residuals
        param_leaves = jax.tree.leaves(self.varying(params))
        it = iter(stored)
        leaves = []
        for kind, arg in kinds:
            if kind == "param":
                leaves.append(param_leaves[arg])
            else:
                leaf = next(it)
                leaves.append(leaf[0] if arg else leaf)
        return jax.tree.unflatten(treedef, leaves)

    def _walk(self, params, stored, cot):
        """Backward through the chunk's layers from the residuals: the input gradient, each
        layer's output gradient, and the parameter gradients (dropped by XLA where unused)."""
        pullbacks = self.pullbacks(params, stored)
        if self.last:  # the loss's pullback, with d(step loss)/d(micro-batch loss) = 1/M
            (cot,) = pullbacks.pop()(self.varying(jnp.asarray(self.inv_m, jnp.float32)))
        grads, outs = {}, []
        for name, pullback in reversed(list(zip(self.names, pullbacks))):
            outs.insert(0, cot)
            g_params, cot = pullback(cot)
            grads[name] = g_params
        return cot, outs, grads

    def bwd_res(self, params, stored, *cot_acc):
        *cot, acc = cot_acc
        g_x, _, grads = self._walk(params, stored, cot[0] if cot else None)
        acc = self.accumulate(acc, grads)
        return acc if self.first else (g_x, acc)

    def bwd_in(self, params, stored, *cot):
        g_x, outs, _ = self._walk(params, stored, cot[0] if cot else None)
        return outs if self.first else (g_x, outs)

    def bwd_w(self, params, stored, outs, acc):
        pullbacks = self.pullbacks(params, stored)
        grads = {name: pb(g)[0] for name, pb, g in zip(self.names, pullbacks, outs)}
        return self.accumulate(acc, grads)

    # -- compiled -----------------------------------------------------------------------

    def programs(self) -> dict[str, Any]:
        pipe, s, last, first = self.pipe, self.c, self.last, self.first
        data, rep = P(AXIS), P()
        out: dict[str, Any] = {}
        out["fwd"] = self.on(self.sm(self.fwd, (rep, rep, data), (data, rep)))
        bwd_out = (data, data, rep, (rep, rep)) if last else (data if first else (data, data))
        out["bwd"] = self.on(
            self.sm(self.bwd, (rep, rep, data, data, data), bwd_out), donate_argnums=4
        )
        layout = (pipe._named(s, pipe.state_specs[s]), pipe._named(s, pipe._acc_specs(s)))
        out["update"] = self.on(
            self.sm(self.update, (rep, data), (rep, data)),
            donate_argnums=(0, 1), out_shardings=layout,
        )  # fmt: skip
        eval_in = (rep, rep, data, data, data) if last else (rep, rep, data)
        out["eval"] = self.on(self.sm(self.evaluate, eval_in, rep if last else data))

        fwd_in = (rep, rep, data, data) if last else (rep, rep, data)
        main_out = ((rep, rep), rep) if last else (data, rep)

        def make_fwd(args):
            # Trace once abstractly to learn the residuals' structure and varying-ness.
            probe = self.sm(lambda *a: self.fwd_res(*a)[:2], fwd_in, main_out)
            with jax.set_mesh(self.mesh):
                jax.eval_shape(probe, *args)
            return self.on(self.sm(self.fwd_res, fwd_in, (*main_out, self.stored_specs())))

        cot_in = () if last else (data,)

        def make(fn, in_specs, out_specs, **kw):
            return lambda args: self.on(self.sm(fn, in_specs(), out_specs()), **kw)

        res = self.stored_specs
        n = len(self.names)
        out["fwd_res"] = Deferred(make_fwd)
        out["bwd_res"] = Deferred(
            make(self.bwd_res, lambda: (rep, res(), *cot_in, data),
                 lambda: data if first else (data, data), donate_argnums=3 - last)
        )  # fmt: skip
        out["bwd_in"] = Deferred(
            make(self.bwd_in, lambda: (rep, res(), *cot_in),
                 lambda: [data] * n if first else (data, [data] * n))
        )  # fmt: skip
        out["bwd_w"] = Deferred(
            make(self.bwd_w, lambda: (rep, res(), [data] * n, data), lambda: data,
                 donate_argnums=3)
        )  # fmt: skip
        return out
