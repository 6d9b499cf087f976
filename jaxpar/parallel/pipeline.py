"""Layer-wise (pipeline) partitioning over the "stage" axis: one program per stage (MPMD).

VGG's stages differ in shape (channels 64..512, resolution 32..1), so instead of the stacked,
padded SPMD carrier, each stage is compiled for its own slice of the mesh,
`mesh.devices[:, s, :]` (data parallelism still applies inside a stage). A stage's parameters
and optimizer state live only on its devices, unpadded. The host walks the schedule's events
(GPipe, 1F1B, interleaved 1F1B, ZB-H1) in dependency order; JAX's asynchronous dispatch lets
stages on different devices run at the same time. Activations and their gradients move between
stage slices with `jax.device_put` within one process. Programs are per chunk (a contiguous
run of layers): one per stage, or v per stage under the interleaved schedule (chunk c on stage
c % K); they are built in stage_programs.py.

`pipeline.remat=True`: backward recomputes the chunk's forward from its stored input, so a
stage keeps one input activation per micro-batch in flight: M under GPipe, at most K - s under
1F1B. `remat=False`: the forward stores the backward's residuals instead (more bytes, no
recomputation), and ZB-H1 splits the backward into B (input gradient) and W (weights).

Several processes (jax.distributed): every process builds the whole mesh and walks the same
events, but runs only the programs of chunks whose stage owns one of its devices (a stage may
span processes: its programs are then SPMD over them). Moves between stages whose devices are not
all this process's go through `transfer.Mover`, one small collective program per move, called by
every process owning either side, in the same order everywhere. The loss reaches every process
(process 0 logs it), and `canonical` gathers each chunk's state onto every device for Orbax.

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
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar.mesh import AXES
from jaxpar.parallel import schedules, stage_programs, stages, tensor, transfer
from jaxpar.parallel.common import Strategy, TrainState, add_sums
from jaxpar.parallel.data import AXIS
from jaxpar.parallel.layout import merge, select


@flax.struct.dataclass
class PipelineState:
    """Per-stage train states, plus per-device unreduced gradient accumulators."""

    stages: tuple[TrainState, ...]
    grad_acc: tuple[Any, ...]  # per stage: params-shaped, leading axis = data replicas


class Pipeline(Strategy):
    name = "pipeline"

    def __init__(self, config, model, mesh, tx):
        super().__init__(config, model, mesh, tx)
        self.num_stages = k = mesh.shape["stage"]
        self.data = mesh.shape["data"]
        self.schedule = config.pipeline.schedule
        self.num_microbatches = 1 if self.schedule == "naive" else config.pipeline.num_microbatches
        # Chunks: contiguous layer runs; chunk c lives on device stage c % K (interleaved
        # schedules hold v > 1 chunks per stage, every other schedule one).
        self.virtual_stages = v = (
            config.pipeline.virtual_stages if self.schedule == "interleaved" else 1
        )
        self.num_chunks = k * v
        self.remat = config.pipeline.remat
        self.bounds = stages.split(model, k * v, config.pipeline.split)
        self.events = schedules.stage_events(self.schedule, k, self.num_microbatches, v)
        self.order = schedules.dispatch_order(self.events)
        self.split_backward = schedules.split_backward(self.events)
        self.meshes = [Mesh(mesh.devices[:, s : s + 1, :], AXES) for s in range(k)]
        self.replicated = [NamedSharding(m, P()) for m in self.meshes]
        self.batch_sharding = [NamedSharding(m, P(AXIS)) for m in self.meshes]
        self.bn_axis_name = AXIS if config.sync.batch_norm == "global" else None
        self.layers = [slice(a, b) for a, b in zip(self.bounds, self.bounds[1:])]
        self.peak_stash_bytes = [0] * k  # per device, measured by the last train step
        self._programs: dict | None = None
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
        # Which stages own a device of this process (all of them in one process), and the
        # mover for transfers that cross processes.
        self.multi = jax.process_count() > 1
        self.local = [transfer.owns(mesh.devices[:, s, :]) for s in range(k)]
        self.mover = transfer.Mover(mesh, self.inflight) if self.multi else None
        self._relayout = [
            stage_programs.OnMesh(jax.jit(lambda v: v, out_shardings=sh), m)
            for sh, m in zip(self.batch_sharding, self.meshes)
        ]
        self._shapes: dict = {}  # micro-batch rows -> per-chunk output shapes
        self.state_specs, self.state_shapes = [], []
        for s in range(self.num_chunks):
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

    def _named(self, c: int, specs):
        mesh = self.meshes[c % self.num_stages]  # chunk c's device stage
        return jax.tree.map(
            lambda x: NamedSharding(mesh, x), specs, is_leaf=lambda x: isinstance(x, P)
        )

    def _acc_specs(self, s: int):
        return jax.tree.map(
            lambda x: P(AXIS, *x), self.state_specs[s].params, is_leaf=lambda x: isinstance(x, P)
        )

    def init_state(self, rng):
        """Each chunk initialises only its layers, directly on its stage's devices."""
        states, accs = [], []
        for s in range(self.num_chunks):
            if not self.local[s % self.num_stages]:  # another process's stage
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
        several processes, each chunk's part is gathered onto every device first (one
        collective per chunk, which every process calls), so that every process holds the
        whole state, as Orbax needs."""
        if not self.multi:
            return merge(list(state.stages))
        k = self.num_stages
        parts = [
            self.mover.gather_tree(st, self.state_shapes[c], c % k, self.state_specs[c])
            for c, st in enumerate(state.stages)
        ]
        return merge(parts)

    def place(self, host_state: TrainState) -> PipelineState:
        """Split a canonical state by stage (its layers' entries of every per-layer dict) and
        put each part on its stage's devices; gradient accumulators start at zero."""
        states, accs = [], []
        for s in range(self.num_chunks):
            if not self.local[s % self.num_stages]:
                states.append(None)
                accs.append(None)
                continue
            names = {layer.name for layer in self.model.layers[self.layers[s]]}
            part = select(host_state, names, {layer.name for layer in self.model.layers})
            states.append(transfer.put(part, self._named(s, self.state_specs[s])))
            acc = jax.tree.map(lambda p: np.zeros((self.data, *p.shape), p.dtype), part.params)
            accs.append(transfer.put(acc, self._named(s, self._acc_specs(s))))
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
            out[key] = [
                transfer.put(p, self.batch_sharding[s]) if self.local[s] else None for p in parts
            ]
        return out

    # -- programs ------------------------------------------------------------------------

    @property
    def programs(self):
        if self._programs is None:
            self._programs = stage_programs.build(self)
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
        """Walk the schedule's events in dispatch order. Each event runs one chunk's program on
        its device stage; what a backward needs is stored from its forward (the stage input,
        or with remat=False the residuals) and counted per device as stored bytes.

        Every process walks every event: it runs the programs of its own stages and counts the
        others' (`InFlight.skip`), so that all of them bound the work in flight at the same
        points of the program order (dispatch.py)."""
        progs, k, c_last, run = self.programs, self.num_stages, self.num_chunks - 1, self._run
        mine = self.local
        st = list(state.stages)
        stats = [None if x is None else x.batch_stats for x in st]
        acc = list(state.grad_acc)
        sent_f, sent_b, stash, kept = {}, {}, {}, {}
        live, peak = [0] * k, [0] * k
        losses, accuracies = [], []
        rows = batch["image"][0].shape[0] if mine[0] else None

        def store(where, key, value, d):
            where[key] = value
            live[d] += _device_bytes(value)
            peak[d] = max(peak[d], live[d])

        def free(where, key, d):
            value = where.pop(key)
            live[d] -= _device_bytes(value)
            return value

        for kind, c, m in self.order:
            d = c % k  # the device stage every program of this event runs on
            y = g = None  # the output sent forward, the gradient sent backward
            if not mine[d]:  # another process's stage: count its program, take part in sends
                if not (kind == "F" and self.remat and c == c_last):  # that one runs nothing
                    self.inflight.skip()
            elif kind == "F":
                params = st[c].params
                x = batch["image"][m] if c == 0 else sent_f.pop((c, m))
                if self.remat:
                    store(stash, (c, m), x, d)
                    if c < c_last:
                        y, stats[c] = run(progs["fwd"][c], params, stats[c], x)
                else:
                    target = (batch["label"][m],) if c == c_last else ()
                    y, stats[c], res = run(progs["fwd_res"][c], params, stats[c], x, *target)
                    store(stash, (c, m), res, d)
                    if c == c_last:
                        losses.append(y[0])
                        accuracies.append(y[1])
            elif kind == "W":
                outs = free(kept, (c, m), d)
                acc[c] = run(progs["bwd_w"][c], st[c].params, free(stash, (c, m), d), outs, acc[c])
            else:
                g = self._backward(c, m, st[c].params, stats, acc, batch, sent_b, stash, kept,
                                   store, free, losses, accuracies)  # fmt: skip
            if kind == "F" and c < c_last:
                sent_f[(c + 1, m)] = self._send(y, d, (c + 1) % k, c, rows)
            elif kind == "B" and c > 0:
                sent_b[(c - 1, m)] = self._send(g, d, (c - 1) % k, c - 1, rows)
        for c in range(self.num_chunks):
            st[c], acc[c] = self._on(
                c % k, lambda c=c: progs["update"][c](st[c].replace(batch_stats=stats[c]), acc[c])
            ) or (None, None)
        self.peak_stash_bytes = peak
        metrics = self._on(
            c_last % k, lambda: _mean_metrics({"loss": losses, "accuracy": accuracies})
        )
        return PipelineState(tuple(st), tuple(acc)), self._to_all(metrics, ("accuracy", "loss"))

    def _backward(self, c, m, params, stats, acc, batch, sent_b, stash, kept, store, free,
                  losses, accuracies):  # fmt: skip
        """One B event of chunk c on this process's stage; returns the input gradient to send
        back (None for chunk 0). Updates the accumulators, statistics and stores in place."""
        progs, run, d, c_last = self.programs, self._run, c % self.num_stages, self.num_chunks - 1
        cot = () if c == c_last else (sent_b.pop((c, m)),)
        g = None
        if self.remat:
            x = free(stash, (c, m), d)
            target = (batch["label"][m],) if c == c_last else cot
            out = run(progs["bwd"][c], params, stats[c], x, *target, acc[c])
            if c == c_last:
                g, acc[c], stats[c], (loss, correct) = out
                losses.append(loss)
                accuracies.append(correct)
            elif c > 0:
                g, acc[c] = out
            else:
                acc[c] = out
        elif self.split_backward:  # B: the input gradient; W runs later from `kept`
            out = run(progs["bwd_in"][c], params, stash[(c, m)], *cot)
            g, outs = out if c > 0 else (None, out)
            store(kept, (c, m), outs, d)
        else:
            out = run(progs["bwd_res"][c], params, free(stash, (c, m), d), *cot, acc[c])
            g, acc[c] = out if c > 0 else (None, out)
        return g

    def _boundary(self, rows: int | None) -> list[jax.ShapeDtypeStruct]:
        """Per chunk, the shape of its output for a micro-batch of `rows` images: what a
        process that does not run a chunk must know to receive from it."""
        if rows is None:  # this process holds no images: the micro-batch size from the config
            rows = self.config.global_batch_size // self.num_microbatches
        if rows not in self._shapes:
            x = jax.ShapeDtypeStruct((rows, *self.model.input_shape), jnp.float32)
            out = []
            for c in range(self.num_chunks):
                shapes = self.state_shapes[c]
                with jax.set_mesh(self.meshes[c % self.num_stages]):  # tensor layout rules
                    x = jax.eval_shape(
                        lambda p, b, x, c=c: self.model.apply(
                            p, b, x, train=False, layers=self.layers[c], constrain=self.constrain
                        )[0],
                        shapes.params,
                        shapes.batch_stats,
                        x,
                    )
                out.append(x)
            self._shapes[rows] = out
        return self._shapes[rows]

    def _send(self, x, src: int, dst: int, chunk: int = 0, rows: int | None = None):
        """Move chunk `chunk`'s output (or the gradient with respect to it) from stage `src`'s
        devices to stage `dst`'s.

        One process: `device_put`. Several: the mover's collective program, which every
        process calls (x is None where it owns none of src's devices; it counts the move
        where it owns none of either side); the result is None where this process owns none
        of dst's devices. A tensor-parallel stage's output is first laid out over "data"
        only, which is one more program on src's devices."""
        if not self.multi:
            return jax.device_put(x, self.batch_sharding[dst])
        if src == dst:  # an interleaved chunk pair on one stage (K = 1 is not a pipeline)
            return x
        shape = self._boundary(rows)[chunk]
        if self.tensor_parallel:
            x = self._on(src, lambda: self._relayout[src](x))
        return self.mover.send(x, src, dst, shape.shape, shape.dtype, P(AXIS))

    def _to_all(self, tree, keys: tuple[str, ...]):
        """Metrics or eval sums (scalars named `keys`, replicated on the last chunk's stage)
        on every device, so that every process reads the same values. One process: as is."""
        if not self.multi:
            return tree
        template = {key: jax.ShapeDtypeStruct((), jnp.float32) for key in keys}
        specs = {key: P() for key in keys}
        last = (self.num_chunks - 1) % self.num_stages
        return self.mover.gather_tree(tree, template, last, specs)

    def _run(self, program, *args):
        """Dispatch one program of this process's stages, counted in the window (dispatch.py)."""
        return self.inflight.add(program(*args))

    def _on(self, stage: int, dispatch):
        """`dispatch()` (one computation) where this process owns a device of `stage`, counted
        in the window; elsewhere only counted. Returns its result, or None."""
        if self.local[stage]:
            return self.inflight.add(dispatch())
        self.inflight.skip()
        return None

    def train_step(self, state, batch):
        return self._step(state, batch)

    def eval_step(self, state, batch):
        """Loss and correct-prediction sums over one eval batch, micro-batch by micro-batch
        through the chunks; every process counts every program (dispatch.py)."""
        progs, k = self.programs, self.num_stages
        rows = batch["image"][0].shape[0] if self.local[0] else None
        last = (self.num_chunks - 1) % k
        totals = None
        for m in range(self.num_microbatches):
            x = batch["image"][m]
            for c in range(self.num_chunks - 1):
                p = state.stages[c]
                y = self._on(c % k, lambda p=p, c=c, x=x: progs["eval"][c](
                    p.params, p.batch_stats, x))  # fmt: skip
                x = self._send(y, c % k, (c + 1) % k, c, rows)
            p = state.stages[-1]
            sums = self._on(last, lambda p=p, x=x, m=m: progs["eval"][-1](
                p.params, p.batch_stats, x, batch["label"][m], batch["mask"][m]))  # fmt: skip
            if totals is None:
                totals = sums
            else:
                totals = self._on(last, lambda t=totals, s=sums: add_sums(t, s))
        return self._to_all(totals, ("correct", "count", "loss_sum"))

    # -- what it costs -------------------------------------------------------------------

    def bytes_between_stages(self, batch_size: int) -> int:
        """Bytes crossing stage boundaries per step: each boundary activation forward and its
        gradient backward, for the whole global batch (float32 as carried here)."""
        total = 0
        for b in self.bounds[1:-1]:
            total += 2 * 4 * batch_size * self.model.layers[b - 1].activation_size
        return total

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
            "analytic_bubble": self.analytic_bubble(),
            "bytes_between_stages_per_step": self.bytes_between_stages(batch_size),
            "peak_stash_bytes_per_device": list(self.peak_stash_bytes),
        }

    def analytic_bubble(self) -> float:
        return schedules.analytic_bubble(
            self.num_stages, self.num_microbatches, self.schedule, self.virtual_stages
        )

    def describe(self, batch_size: int) -> str:
        """The stage table and the schedule, drawn per stage."""
        analytic = self.analytic_bubble()
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


@jax.jit
def _mean_metrics(metrics: dict[str, list]) -> dict[str, jax.Array]:
    """The step's loss and accuracy: means over the micro-batches, in one computation."""
    return {key: sum(values) / len(values) for key, values in metrics.items()}


def _device_bytes(tree) -> int:
    """Bytes one device holds of `tree` (its first shard of every leaf)."""
    return sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(tree))


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"
