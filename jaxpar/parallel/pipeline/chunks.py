"""The compiled programs of one pipeline chunk (a contiguous run of layers on one stage's
devices), built from a small description of the chunk (`Chunk`), not from the pipeline.

Per chunk: forward, backward, update and eval, and (`pipeline.remat=False`) the programs that
keep the backward's residuals instead of recomputing the forward:

- fwd: forward only (`remat=True`: its backward recomputes it from the stored input).
- bwd: recompute the forward from the stored input, then vjp: input gradient, and parameter
  gradients added into the accumulator.
- fwd_res, bwd_res, bwd_in, bwd_w (zero-bubble B and W): the residual programs, whose
  bodies are residuals.py's (ChunkPrograms takes them from its `ResidualPrograms` base).
- update (or, under an adapting rate, combine and apply_update): the sync rule combines the
  replicas' accumulated gradients and applies them; their bodies are updates.py's.

The gradient noise scale (`Chunk.measure`, noise_scale.py): the accumulator is then a pair,
(gradients, per replica the sum of its micro-batches' squared gradient norms), each increment's
squared norm taken as it is added; update returns the chunk's two parts of the step's squared
norms as scalars, which the runner adds over the chunks. Under fsdp a sharded leaf's increment
arrives summed over the replicas, so each layer's backward squares the replica's own first:
the chunk's forward passes a zero `probe` to its sharded layers, whose cotangent is that
squared norm (variables.Gathered.probed).

Every program takes the chunk's placed TrainState (the runner puts the current BatchNorm
statistics in); what a replica computes with is its sync rule's `local_params`/`local_stats`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxpar import mesh as mesh_lib
from jaxpar.parallel import tensor
from jaxpar.parallel.pipeline.residuals import ResidualPrograms
from jaxpar.parallel.pipeline.updates import UpdatePrograms
from jaxpar.parallel.replicas import Replicas
from jaxpar.parallel.state import accuracy, cross_entropy, logit_sums
from jaxpar.parallel.sync.base import SyncRule, manual

NAMES = (
    "fwd",
    "bwd",
    "update",
    "combine",
    "apply_update",
    "eval",
    "fwd_res",
    "bwd_res",
    "bwd_in",
    "bwd_w",
)


@dataclasses.dataclass(eq=False)
class Chunk:
    """What a chunk's programs are built from."""

    index: int
    stage: int  # the device stage that holds it
    layers: slice  # its layers of the model
    first: bool
    last: bool
    mesh: Mesh  # its stage's devices: the mesh at one index of the stage axis
    model: Any
    rule: SyncRule  # how its data replicas agree
    replicas: Replicas
    num_microbatches: int
    auto_axes: bool  # rules axes (tensor) left to the sharding rules
    constrain: Any  # model.apply's activation layout under tensor parallelism, or None
    state_specs: Any  # PartitionSpecs of its placed TrainState, every mesh axis
    acc_specs: Any  # of its per-replica gradient accumulator
    gather: Any = None  # model.apply's gather of sharded parameters (fsdp), or None
    measure: bool = False  # the noise scale's squared norms too (the accumulator a pair)
    # An adapting rate (lr_adaptation=adascale): the step's two squared norms and their batch
    # sizes (b_small, b_big) reach the optimizer, so the update runs in two programs,
    # `combine` and `apply_update`, with the whole model's norms added up between them.
    adapt: tuple[float, float] | None = None

    @property
    def param_specs(self):
        return self.rule.variable_specs["params"]


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


class ChunkPrograms(ResidualPrograms, UpdatePrograms):
    """The programs of one chunk (methods named as in NAMES, compiled by `_build`; the
    residual ones from ResidualPrograms, the accumulation and the update from
    UpdatePrograms)."""

    def __init__(self, chunk: Chunk):
        self.ck = ck = chunk
        self.layer_ids = range(len(ck.model.layers))[ck.layers]
        self.names = [ck.model.layers[i].name for i in self.layer_ids]
        self.inv_m = 1.0 / ck.num_microbatches
        self.residuals: tuple | None = None  # (treedef, kinds), set when fwd_res is traced
        self.loss_dtype = None  # the last chunk's loss dtype, also set then
        self.programs = self._build()

    # -- helpers ------------------------------------------------------------------------

    def local(self, state):
        """(params, stats) this replica computes with."""
        return self.ck.rule.local_params(state), self.ck.rule.local_stats(state.batch_stats)

    def apply(self, params, stats, x, layers, train=True, probe=None):
        bn = self.ck.rule.bn_axis_name if train else None
        gather = self.ck.gather if probe is None else self.ck.gather.probed(probe)
        return self.ck.model.apply(
            params,
            stats,
            x,
            train=train,
            layers=layers,
            bn_axis_name=bn,
            constrain=self.ck.constrain,
            gather=gather,
        )

    def probe(self):
        """The zero scalar a measuring fsdp chunk differentiates at (per replica), or None."""
        if self.ck.measure and self.ck.gather is not None:
            return self.ck.replicas.varying(jnp.zeros((), jnp.float32))
        return None

    def loss(self, y, target):
        return cross_entropy(y, target), accuracy(y, target)

    def in_layout(self, grads):
        return tensor.constrain_tree(grads, self.ck.param_specs) if self.ck.auto_axes else grads

    def boundary(self, x):
        """An activation or its gradient leaving the chunk for another stage: whole over the
        automatic axes (tensor), split over the batch axes only, as the next stage takes it.
        Left to the compiler, a tensor stage's output is split by channel, and moving that to
        another stage's batch layout goes through the host (a blocking copy)."""
        if not self.ck.auto_axes or x is None:
            return x
        mesh = jax.sharding.get_abstract_mesh()
        return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, P()))

    def sm(self, fn, in_specs, out_specs, check_vma: bool = True):
        ck = self.ck
        return ck.replicas.shard_map(fn, ck.mesh, in_specs, out_specs, ck.auto_axes, check_vma)

    def on(self, fn, **jit_kwargs):
        return OnMesh(jax.jit(fn, **jit_kwargs), self.ck.mesh)

    # -- recomputing programs (remat=True) and the rest ---------------------------------

    def fwd(self, state, x):
        params, stats = self.local(state)
        y, new_stats = self.apply(params, stats, x, self.ck.layers)
        return self.boundary(y), self.ck.rule.placed_stats(new_stats)

    def bwd(self, state, x, target, acc):
        params, stats = self.local(state)

        def f(p, x, probe):
            y, new_stats = self.apply(p, stats, x, self.ck.layers, probe=probe)
            if not self.ck.last:
                return y, new_stats
            loss, correct = self.loss(y, target)
            return loss, (new_stats, correct)

        out, vjp, aux = jax.vjp(f, params, x, self.probe(), has_aux=True)
        # d(step loss)/d(micro-batch loss) = 1/M; the local loss is per replica.
        r = self.ck.replicas
        cot = r.varying(jnp.asarray(self.inv_m, out.dtype)) if self.ck.last else target
        g_params, g_x, sharded_sq = vjp(cot)
        acc = self.accumulate(acc, g_params, sharded_sq)
        if self.ck.last:
            new_stats, correct = aux
            metrics = (r.pmean(out), r.pmean(correct))
            return self.boundary(g_x), acc, self.ck.rule.placed_stats(new_stats), metrics
        return (self.boundary(g_x), acc) if not self.ck.first else acc

    def evaluate(self, state, x, *label_mask):
        params, stats = self.ck.rule.eval_model(state)
        y, _ = self.apply(params, stats, x, self.ck.layers, train=False)
        if not label_mask:
            return self.boundary(y)
        return self.ck.replicas.psum(logit_sums(y, *label_mask))

    # -- compiled -----------------------------------------------------------------------

    def _build(self) -> dict[str, Any]:
        ck, first, last = self.ck, self.ck.first, self.ck.last
        r = ck.replicas
        data, st, acc = r.spec, manual(ck.state_specs, r), manual(ck.acc_specs, r)
        out: dict[str, Any] = {}
        stats_spec = st.batch_stats
        out["fwd"] = self.on(self.sm(self.fwd, (st, data), (data, stats_spec)))
        bwd_out = (data, acc, stats_spec, (P(), P())) if last else (acc if first else (data, acc))
        out["bwd"] = self.on(self.sm(self.bwd, (st, data, data, acc), bwd_out), donate_argnums=3)
        update_out, placed = (st, acc), self.placed()
        if ck.measure:
            scalar = jax.sharding.NamedSharding(ck.mesh, P())
            update_out, placed = (*update_out, (P(), P())), (*placed, (scalar, scalar))
        out["update"] = self.on(
            self.sm(self.update, (st, acc), update_out), donate_argnums=(0, 1), out_shardings=placed
        )
        if ck.adapt is not None:
            scalars = (P(), P())
            out["combine"] = self.on(
                self.sm(self.combine, (st, acc), (data, acc, scalars)), donate_argnums=1
            )
            metrics = {"gain": P(), "progress": P(), "learning_rate": P()}
            # check_vma=False: the combined gradient arrives stacked over the replicas, so it
            # is typed as varying over them, though under allreduce every replica holds the
            # same values (there is no cast back from varying): the state that leaves is the
            # same on every replica, as the rule makes it (held by the tests to one device's)
            out["apply_update"] = self.on(
                self.sm(self.apply_update, (st, data, scalars), (st, metrics), check_vma=False),
                donate_argnums=(0, 1),
                out_shardings=(placed[0], None),
            )
        eval_in = (st, data, data, data) if last else (st, data)
        out["eval"] = self.on(self.sm(self.evaluate, eval_in, P() if last else data))

        fwd_in = (st, data, data) if last else (st, data)
        main_out = ((P(), P()), stats_spec) if last else (data, stats_spec)

        def make_fwd(args):
            # Trace once abstractly to learn the residuals' structure and varying-ness.
            probe = self.sm(lambda *a: self.fwd_res(*a)[:2], fwd_in, main_out)
            with jax.set_mesh(ck.mesh):
                jax.eval_shape(probe, *args)
            return self.on(self.sm(self.fwd_res, fwd_in, (*main_out, self.stored_specs())))

        cot_in = () if last else (data,)

        def make(fn, in_specs, out_specs, **kw):
            return lambda args: self.on(self.sm(fn, in_specs(), out_specs()), **kw)

        res, n = self.stored_specs, len(self.names)
        out["fwd_res"] = Deferred(make_fwd)
        out["bwd_res"] = Deferred(
            make(
                self.bwd_res,
                lambda: (st, res(), *cot_in, acc),
                lambda: acc if first else (data, acc),
                donate_argnums=3 - last,
            )
        )
        out["bwd_in"] = Deferred(
            make(
                self.bwd_in,
                lambda: (st, res(), *cot_in),
                lambda: [data] * n if first else (data, [data] * n),
            )
        )
        out["bwd_w"] = Deferred(
            make(self.bwd_w, lambda: (st, res(), [data] * n, acc), lambda: acc, donate_argnums=3)
        )
        return out

    def placed(self):
        """NamedShardings of (state, accumulator) on the chunk's stage."""
        specs = (self.ck.state_specs, self.ck.acc_specs)
        return tuple(mesh_lib.shardings(self.ck.mesh, s) for s in specs)
