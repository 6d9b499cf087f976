"""Layer-wise (pipeline) partitioning over the "stage" axis: one program per stage (MPMD).

VGG's stages differ in shape (channels 64..512, resolution 32..1), so instead of the stacked,
padded SPMD carrier, each stage is compiled for its own slice of the mesh,
`mesh.devices[:, s, :]` (data parallelism still applies inside a stage). A stage's parameters
and optimizer state live only on its devices, unpadded. The host walks the schedule's events
(GPipe, 1F1B) in dependency order; JAX's asynchronous dispatch lets stages on different devices
run at the same time. Activations and their gradients move between stage slices with
`jax.device_put` within one process.

Several processes (jax.distributed): every process builds the whole mesh and walks the same
events, but runs only the programs of stages that own one of its devices (a stage may span
processes: its programs are then SPMD over them). Moves between stages whose devices are not
all this process's go through `transfer.Mover`, one small collective program per move, called by
every process owning either side, in the same order everywhere. The loss reaches every process
(process 0 logs it), and `canonical` gathers each stage's state onto every device for Orbax.

Backward recomputes the stage's forward from its stored input (rematerialisation), so a stage
keeps one input activation per micro-batch in flight: M under GPipe, at most K - s under 1F1B.

Per step and stage: one gradient all-reduce over "data" (`average_gradients` in `update`);
micro-batch gradients accumulate unreduced on each device until then.

BatchNorm policy: statistics per micro-batch (over the micro-batch on all data replicas), and
the running averages are updated once per micro-batch, in micro-batch order. With one
micro-batch this is the single-device step; with BatchNorm off any M is.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar.mesh import AXES
from jaxpar.parallel import schedules, stages, tensor, transfer
from jaxpar.parallel.common import Strategy, TrainState, logit_sums
from jaxpar.parallel.data import AXIS, average_gradients


@flax.struct.dataclass
class PipelineState:
    """Per-stage train states, plus per-device unreduced gradient accumulators."""

    stages: tuple[TrainState, ...]
    grad_acc: tuple[Any, ...]  # per stage: params-shaped, leading axis = data replicas


def merge(trees: list[Any]) -> Any:
    """Merge per-stage pytrees whose dicts hold disjoint layer names (params, optimizer state)
    into one; leaves shared by every stage (step counts) are taken from stage 0."""
    first = trees[0]
    if isinstance(first, dict):
        out: dict = {}
        for tree in trees:
            out.update(tree)
        return out
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(merge(list(parts)) for parts in zip(*trees)))
    if isinstance(first, (tuple, list)):
        return type(first)(merge(list(parts)) for parts in zip(*trees))
    if dataclass_fields := getattr(first, "__dataclass_fields__", None):
        return first.replace(**{k: merge([getattr(t, k) for t in trees]) for k in dataclass_fields})
    return first


def select(tree: Any, keep: set[str], layer_names: set[str]) -> Any:
    """The inverse of `merge`: keep only `keep`'s entries of every dict keyed by layer names."""
    if isinstance(tree, dict):
        if tree and set(tree) <= layer_names:
            return {k: v for k, v in tree.items() if k in keep}
        return {k: select(v, keep, layer_names) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(select(v, keep, layer_names) for v in tree))
    if isinstance(tree, (tuple, list)):
        return type(tree)(select(v, keep, layer_names) for v in tree)
    if fields := getattr(tree, "__dataclass_fields__", None):
        return tree.replace(**{k: select(getattr(tree, k), keep, layer_names) for k in fields})
    return tree


class Pipeline(Strategy):
    name = "pipeline"

    def __init__(self, config, model, mesh, tx):
        super().__init__(config, model, mesh, tx)
        self.num_stages = k = mesh.shape["stage"]
        self.data = mesh.shape["data"]
        self.schedule = config.pipeline.schedule
        self.num_microbatches = 1 if self.schedule == "naive" else config.pipeline.num_microbatches
        self.bounds = stages.split(model, k, config.pipeline.split)
        self.events = schedules.stage_events(self.schedule, k, self.num_microbatches)
        self.order = schedules.dispatch_order(self.events)
        self.meshes = [Mesh(mesh.devices[:, s : s + 1, :], AXES) for s in range(k)]
        self.replicated = [NamedSharding(m, P()) for m in self.meshes]
        self.batch_sharding = [NamedSharding(m, P(AXIS)) for m in self.meshes]
        self.bn_axis_name = AXIS if config.sync.batch_norm == "global" else None
        self.layers = [slice(a, b) for a, b in zip(self.bounds, self.bounds[1:])]
        self.peak_stash_bytes = [0] * k  # per device, measured by the last train step
        self._programs: dict | None = None
        self._shapes: dict = {}  # micro-batch rows -> per-stage output shapes
        # Tensor parallelism inside each stage: sharding rules over "tensor" (automatic),
        # explicit collectives over "data" (manual). With one data replica the stage programs
        # are plain SPMD (XLA refuses a manual all-reduce over a size-1 axis beside automatic
        # ones, and none is needed).
        self.tensor_parallel = mesh.shape["tensor"] > 1
        rules = tensor.rules_from(config)
        if self.tensor_parallel:
            tensor.check(model, rules, dict(mesh.shape))
        self.spmd_only = self.tensor_parallel and self.data == 1
        self.constrain = tensor.constrain_fn(rules) if self.tensor_parallel else None
        # Which stages own a device of this process (all of them in a single process), and
        # the mover for transfers that cross processes.
        self.multi = jax.process_count() > 1
        self.local = [transfer.owns(mesh.devices[:, s, :]) for s in range(k)]
        self.mover = transfer.Mover(mesh) if self.multi else None
        self._relayout = [
            _OnMesh(jax.jit(lambda v: v, out_shardings=sh), m)
            for sh, m in zip(self.batch_sharding, self.meshes)
        ]
        self.state_specs, self.state_shapes = [], []
        for s in range(k):
            shapes = jax.eval_shape(lambda r, s=s: self._init_stage(r, s)[0], jax.random.key(0))
            self.state_shapes.append(shapes)
            self.state_specs.append(
                tensor.state_specs(shapes, model, rules, self.layers[s])
                if self.tensor_parallel
                else jax.tree.map(lambda _: P(), shapes)
            )

    # -- state ---------------------------------------------------------------------------

    def _init_stage(self, rng, s: int):
        v = self.model.init(rng, self.layers[s])
        params = v["params"]
        state = TrainState(jnp.zeros((), jnp.int32), params, v["batch_stats"], self.tx.init(params))
        acc = jax.tree.map(lambda p: jnp.zeros((self.data, *p.shape), p.dtype), params)
        return state, acc

    def _named(self, s: int, specs):
        return jax.tree.map(
            lambda x: NamedSharding(self.meshes[s], x), specs, is_leaf=lambda x: isinstance(x, P)
        )

    def _acc_specs(self, s: int):
        return jax.tree.map(
            lambda x: P(AXIS, *x), self.state_specs[s].params, is_leaf=lambda x: isinstance(x, P)
        )

    def init_state(self, rng):
        """Each stage initialises only its layers, directly on its own devices."""
        states, accs = [], []
        for s in range(self.num_stages):
            if not self.local[s]:  # another process's stage
                states.append(None)
                accs.append(None)
                continue
            shardings = (self._named(s, self.state_specs[s]), self._named(s, self._acc_specs(s)))
            state, acc = jax.jit(functools.partial(self._init_stage, s=s), out_shardings=shardings)(
                rng
            )
            states.append(state)
            accs.append(acc)
        return PipelineState(tuple(states), tuple(accs))

    def canonical(self, state: PipelineState) -> TrainState:
        """The layout-free state: one per-layer TrainState, as on a single device. With
        several processes, each stage's part is gathered onto every device first (a collective
        every process calls), so that every process holds the whole state, as Orbax needs."""
        if not self.multi:
            return merge(list(state.stages))
        parts = [
            self.mover.gather_tree(st, self.state_shapes[s], s, self.state_specs[s])
            for s, st in enumerate(state.stages)
        ]
        return merge(parts)

    def place(self, host_state: TrainState) -> PipelineState:
        """Split a canonical state by stage (its layers' entries of every per-layer dict) and
        put each part on its stage's devices; gradient accumulators start at zero."""
        states, accs = [], []
        for s in range(self.num_stages):
            if not self.local[s]:
                states.append(None)
                accs.append(None)
                continue
            names = {layer.name for layer in self.model.layers[self.layers[s]]}
            part = select(host_state, names, {layer.name for layer in self.model.layers})
            states.append(_put(part, self._named(s, self.state_specs[s])))
            acc = jax.tree.map(lambda p: np.zeros((self.data, *p.shape), p.dtype), part.params)
            accs.append(_put(acc, self._named(s, self._acc_specs(s))))
        return PipelineState(tuple(states), tuple(accs))

    def batch_share(self) -> tuple[int, int]:
        """Every process reads the whole global batch: stage 0's devices need the images and
        the last stage's the labels, whichever processes those are (each keeps its rows)."""
        return 0, 1

    def put_batch(self, local_batch):
        """Split the global batch into M micro-batches; images go to stage 0, the rest
        (labels, eval mask) to the last stage, each sharded over that stage's data axis."""
        m = self.num_microbatches
        out = {}
        for key, value in local_batch.items():
            s = 0 if key == "image" else self.num_stages - 1
            parts = np.split(value, m)
            out[key] = [_put(p, self.batch_sharding[s]) if self.local[s] else None for p in parts]
        return out

    # -- programs ------------------------------------------------------------------------

    def _stage_fn(self, s: int):
        bn_axis = None if self.spmd_only else self.bn_axis_name

        def fn(params, stats, x, train=True):
            return self.model.apply(
                params,
                stats,
                x,
                train=train,
                layers=self.layers[s],
                bn_axis_name=bn_axis if train else None,
                constrain=self.constrain,
            )

        return fn

    def _pmean(self, x):
        return x if self.spmd_only else lax.pmean(x, AXIS)

    def _varying(self, x):
        return x if self.spmd_only else lax.pcast(x, AXIS, to="varying")

    def _sync_stats(self, stats):
        return stats if self.bn_axis_name or not stats else self._pmean(stats)

    def _build(self):
        """Compile-ready programs per stage: forward, backward (recompute + vjp), update."""
        k, inv_m = self.num_stages, 1.0 / self.num_microbatches
        progs: dict[str, list] = {"fwd": [], "bwd": [], "update": [], "eval": []}
        for s in range(k):
            fn, mesh, last = self._stage_fn(s), self.meshes[s], s == k - 1

            def fwd(params, stats, x, fn=fn):
                y, new_stats = fn(params, stats, x)
                return y, self._sync_stats(new_stats)

            def bwd(params, stats, x, target, acc, fn=fn, s=s, last=last):
                local = self._varying(params)

                def f(p, x):
                    y, new_stats = fn(p, stats, x)
                    if not last:
                        return y, new_stats
                    loss = optax.softmax_cross_entropy_with_integer_labels(y, target).mean()
                    correct = jnp.mean(jnp.argmax(y, -1) == target)
                    return loss, (new_stats, correct)

                out, vjp, aux = jax.vjp(f, local, x, has_aux=True)
                # d(step loss)/d(micro-batch loss) = 1/M; the local loss is per replica.
                cot = self._varying(jnp.asarray(inv_m, out.dtype)) if last else target
                g_params, g_x = vjp(cot)
                if self.tensor_parallel:  # accumulate in the parameters' layout
                    g_params = tensor.constrain_tree(g_params, self.state_specs[s].params)
                acc = jax.tree.map(lambda a, g: a + g[None], acc, g_params)
                if last:
                    new_stats, correct = aux
                    metrics = (self._pmean(out), self._pmean(correct))
                    return g_x, acc, self._sync_stats(new_stats), metrics
                return (g_x, acc) if s > 0 else acc

            def update(state, acc, s=s):
                grads = jax.tree.map(lambda a: a[0], acc)
                grads = grads if self.spmd_only else average_gradients(grads)
                if self.tensor_parallel:  # keep the update in the parameters' layout
                    grads = tensor.constrain_tree(grads, self.state_specs[s].params)
                updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
                new = state.replace(
                    step=state.step + 1,
                    opt_state=opt_state,
                    params=optax.apply_updates(state.params, updates),
                )
                return new, jax.tree.map(jnp.zeros_like, acc)

            def evaluate(params, stats, x, *label_mask, fn=fn):
                y, _ = fn(params, stats, x, train=False)
                if not label_mask:
                    return y
                sums = logit_sums(y, *label_mask)
                return sums if self.spmd_only else lax.psum(sums, AXIS)

            def sm(fn, in_specs, out_specs, mesh=mesh):
                if self.spmd_only:
                    return fn
                manual = frozenset({AXIS}) if self.tensor_parallel else frozenset()
                return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                     axis_names=manual)  # fmt: skip

            data, rep = P(AXIS), P()
            on = functools.partial(_OnMesh, mesh=mesh)
            progs["fwd"].append(
                on(jax.jit(sm(fwd, in_specs=(rep, rep, data), out_specs=(data, rep))))
            )
            bwd_out = (data, data, rep, (rep, rep)) if last else ((data, data) if s else data)
            progs["bwd"].append(
                on(
                    jax.jit(
                        sm(bwd, in_specs=(rep, rep, data, data, data), out_specs=bwd_out),
                        donate_argnums=4,
                    )
                )
            )
            layout = (self._named(s, self.state_specs[s]), self._named(s, self._acc_specs(s)))
            progs["update"].append(
                on(
                    jax.jit(
                        sm(update, in_specs=(rep, data), out_specs=(rep, data)),
                        donate_argnums=(0, 1),
                        out_shardings=layout,
                    )
                )
            )
            eval_in = (rep, rep, data, data, data) if last else (rep, rep, data)
            progs["eval"].append(
                on(jax.jit(sm(evaluate, in_specs=eval_in, out_specs=rep if last else data)))
            )
        return progs

    @property
    def programs(self):
        if self._programs is None:
            self._programs = self._build()
        return self._programs

    def _jit_train(self):  # the pipeline step is a host-side walk over many programs
        raise NotImplementedError

    def _jit_eval(self):
        raise NotImplementedError

    def compile(self, state, batch):
        """Compile every stage program by running one step on a throwaway copy of the state."""
        t0 = time.perf_counter()
        scratch = jax.tree.map(jnp.copy, state)
        jax.block_until_ready(self._step(scratch, batch))
        self.compile_time_s = time.perf_counter() - t0
        self._train = self._step
        return self

    # -- the step ------------------------------------------------------------------------

    def _step(self, state: PipelineState, batch):
        progs, k, run, mine = self.programs, self.num_stages, self._run, self.local
        st = list(state.stages)
        stats = [None if x is None else x.batch_stats for x in st]
        acc = list(state.grad_acc)
        sent_f, sent_b, stash = {}, {}, {}
        live = [0] * k
        peak = [0] * k
        losses, accuracies = [], []
        rows = batch["image"][0].shape[0] if mine[0] else None
        for kind, s, m in self.order:
            # Every process walks every event; it computes only its own stages' events, and
            # takes part in every transfer one of its devices is on (see `_send`).
            if kind == "F":
                y = None
                if mine[s]:
                    x = batch["image"][m] if s == 0 else sent_f.pop((s, m))
                    stash[(s, m)] = x
                    live[s] += x.nbytes // self.data
                    peak[s] = max(peak[s], live[s])
                    if s < k - 1:
                        y, stats[s] = run(progs["fwd"][s], st[s].params, stats[s], x)
                if s < k - 1:
                    sent_f[(s + 1, m)] = self._send(y, s, s + 1, rows)
                continue
            g = None
            if mine[s]:
                x = stash.pop((s, m))
                live[s] -= x.nbytes // self.data
                if s == k - 1:
                    g, acc[s], stats[s], (loss, correct) = run(
                        progs["bwd"][s], st[s].params, stats[s], x, batch["label"][m], acc[s]
                    )
                    losses.append(loss)
                    accuracies.append(correct)
                elif s > 0:
                    g, acc[s] = run(
                        progs["bwd"][s], st[s].params, stats[s], x, sent_b.pop((s, m)), acc[s]
                    )
                else:
                    acc[s] = run(
                        progs["bwd"][s], st[s].params, stats[s], x, sent_b.pop((s, m)), acc[s]
                    )
            if s > 0:
                sent_b[(s - 1, m)] = self._send(g, s, s - 1, rows)
        for s in range(k):
            if mine[s]:
                st[s], acc[s] = run(progs["update"][s], st[s].replace(batch_stats=stats[s]), acc[s])
        self.peak_stash_bytes = peak
        metrics = None
        if mine[-1]:
            metrics = {
                "loss": sum(losses) / len(losses),
                "accuracy": sum(accuracies) / len(losses),
            }
        return PipelineState(tuple(st), tuple(acc)), self._to_all(metrics, ("loss", "accuracy"))

    def _boundary(self, rows: int | None) -> list[jax.ShapeDtypeStruct]:
        """Per stage, the shape of its output for a micro-batch of `rows` images: what a
        process that does not run a stage must know to receive from it."""
        if rows is None:  # this process holds no images: the micro-batch size from the config
            rows = self.config.global_batch_size // self.num_microbatches
        if rows not in self._shapes:
            x = jax.ShapeDtypeStruct((rows, *self.model.input_shape), jnp.float32)
            out = []
            for s in range(self.num_stages):
                shapes = self.state_shapes[s]
                with jax.set_mesh(self.meshes[s]):  # tensor-parallel layout constraints
                    x = jax.eval_shape(
                        lambda p, b, x, s=s: self._stage_fn(s)(p, b, x, train=False)[0],
                        shapes.params,
                        shapes.batch_stats,
                        x,
                    )
                out.append(x)
            self._shapes[rows] = out
        return self._shapes[rows]

    def _send(self, x, src: int, dst: int, rows: int | None = None):
        """Move an activation (or its gradient) from stage `src`'s devices to stage `dst`'s.

        One process: `device_put`. Several: the mover's collective program, which every
        process owning a device of either stage calls (x is None where it owns none of
        src's); the result is None where this process owns none of dst's devices."""
        if not self.multi:
            return jax.device_put(x, self.batch_sharding[dst])
        if not (self.local[src] or self.local[dst]):
            return None
        shape = self._boundary(rows)[min(src, dst)]
        if x is not None and not x.sharding.is_equivalent_to(self.batch_sharding[src], x.ndim):
            x = self._relayout[src](x)  # e.g. a tensor-parallel stage's output
        y = self.mover.send(x, src, dst, shape.shape, shape.dtype, P(AXIS))
        return None if y is None else self.inflight.add(y)

    def _to_all(self, tree, keys: tuple[str, ...]):
        """Metrics or eval sums (scalars named `keys`, replicated on the last stage) on every
        device, so that every process reads the same values. One process: unchanged."""
        if not self.multi:
            return tree
        template = {key: jax.ShapeDtypeStruct((), jnp.float32) for key in keys}
        specs = {key: P() for key in keys}
        last = self.num_stages - 1
        return self.inflight.add(self.mover.gather_tree(tree, template, last, specs))

    def _run(self, program, *args):
        """Dispatch one stage program, keeping the work in flight bounded (dispatch.py)."""
        return self.inflight.add(program(*args))

    def train_step(self, state, batch):
        return self._step(state, batch)

    def eval_step(self, state, batch):
        progs, k, mine = self.programs, self.num_stages, self.local
        rows = batch["image"][0].shape[0] if mine[0] else None
        totals = None
        for m in range(self.num_microbatches):
            x = batch["image"][m]
            for s in range(k - 1):
                y = None
                if mine[s]:
                    p = state.stages[s]
                    y = self._run(progs["eval"][s], p.params, p.batch_stats, x)
                x = self._send(y, s, s + 1, rows)
            if mine[-1]:
                last = state.stages[-1]
                sums = self._run(
                    progs["eval"][-1],
                    last.params,
                    last.batch_stats,
                    x,
                    batch["label"][m],
                    batch["mask"][m],
                )
                totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        return self._to_all(totals, ("correct", "count", "loss_sum"))

    # -- what it costs -------------------------------------------------------------------

    def report(self, state, batch, batch_size: int, timing: bool = True) -> dict[str, Any]:
        """The step's figures (see `analysis.report`). Across processes no process can walk
        every stage, so only the schedule's figures are given; run `--explain` or the
        benchmark in one process for memory, collectives and the measured bubble."""
        if not self.multi:
            return super().report(state, batch, batch_size, timing)
        return {
            "num_stages": self.num_stages,
            "pipeline_schedule": self.schedule,
            "num_microbatches": self.num_microbatches,
            "stage_bounds": list(self.bounds),
            "analytic_bubble": schedules.analytic_bubble(self.num_stages, self.num_microbatches),
            "bytes_between_stages_per_step": self.bytes_between_stages(batch_size),
            "peak_stash_bytes_per_device": list(self.peak_stash_bytes),
        }

    def bytes_between_stages(self, batch_size: int) -> int:
        """Bytes crossing stage boundaries per step: each boundary activation forward and its
        gradient backward, for the whole global batch (float32 as carried here)."""
        total = 0
        for b in self.bounds[1:-1]:
            total += 2 * 4 * batch_size * self.model.layers[b - 1].activation_size
        return total

    def describe(self, batch_size: int) -> str:
        """The stage table and the schedule, drawn per stage."""
        analytic = schedules.analytic_bubble(self.num_stages, self.num_microbatches)
        return "\n".join(
            [
                (
                    f"pipeline: {self.num_stages} stages, split {self.config.pipeline.split!r} "
                    f"{self.bounds}, schedule {self.schedule}, {_plural(self.num_microbatches, 'micro-batch', 'micro-batches')}, "
                    f"analytic bubble {analytic:.3f}"
                ),
                stages.stage_table(self.model, self.bounds, batch_size),
                "schedule (per stage: F/B = forward/backward of micro-batch i):",
                schedules.render(self.events),
            ]
        )


def _put(tree, shardings):
    """Host arrays onto (possibly multi-process) shardings: each process supplies the blocks
    of its own devices from the whole host value it holds."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)
    return jax.tree.map(
        lambda x, sh: jax.make_array_from_callback(np.shape(x), sh, lambda i: np.asarray(x)[i]),
        tree,
        shardings,
    )


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


class _OnMesh:
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
