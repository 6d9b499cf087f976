"""The pipeline strategy: its chunks built and placed on their stages, the state split by
chunk, the batch split into micro-batches, and the step run by the runner. The package's
docstring (__init__.py) says how the pipeline works; accounting.py what a step runs and moves.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from jaxpar import axes
from jaxpar import mesh as mesh_lib
from jaxpar.errors import ConfigError
from jaxpar.parallel import norms, schedules, stages, sync, tensor, variables
from jaxpar.parallel.buckets import Buckets
from jaxpar.parallel.pipeline import accounting, checks, shapes, transfer
from jaxpar.parallel.pipeline.chunks import Chunk, ChunkPrograms
from jaxpar.parallel.pipeline.layout import ChunkLayout, merge
from jaxpar.parallel.pipeline.runner import Runner
from jaxpar.parallel.replicas import Replicas
from jaxpar.parallel.strategy import Strategy


@flax.struct.dataclass
class PipelineState:
    """Per-chunk train states, plus per-device unreduced gradient accumulators."""

    chunks: tuple  # per chunk: its TrainState (None in a process that owns none of its stage)
    grad_acc: tuple  # per chunk: params-shaped, a leading axis over the data replicas


class Pipeline(Strategy):
    name = "pipeline"

    @classmethod
    def check(cls, config, shape):
        return checks.problem(config, shape)

    @classmethod
    def check_model(cls, config, shape, model):
        return checks.model_problem(config, shape, model)

    def __init__(self, config, model, mesh, tx):
        super().__init__(config, model, mesh, tx)
        shape = dict(mesh.shape)
        self.stage_axis = axes.stage_axis(shape)
        self.k = k = shape[self.stage_axis]
        self.schedule = config.pipeline.schedule
        self.num_microbatches = 1 if self.schedule == "naive" else config.pipeline.num_microbatches
        if self.num_microbatches == 0:
            raise ConfigError(
                "pipeline.num_microbatches=0 is chosen by timing in a training run (jaxpar.train,"
                " the bench); give a count here"
            )
        self.virtual_stages = v = (
            config.pipeline.virtual_stages if self.schedule == "interleaved" else 1
        )
        self.stage_of = schedules.placement(self.schedule, k, v)
        self.num_chunks = len(self.stage_of)
        self.remat = config.pipeline.remat
        self.bounds = stages.split(model, self.num_chunks, config.pipeline.split)
        self.events = schedules.stage_events(self.schedule, k, self.num_microbatches, v)
        self.order = schedules.dispatch_order(self.events)
        self.split_backward = schedules.split_backward(self.events)
        self.meshes = [mesh_lib.index_along(mesh, self.stage_axis, s) for s in range(k)]
        self.replicas = Replicas(shape, Buckets.of(self.sync, model))
        self.data = self.replicas.count
        self.batch_spec = self.replicas.spec
        self.batch_sharding = [NamedSharding(m, self.batch_spec) for m in self.meshes]
        # the rules axes (tensor parallelism) inside each stage
        self.auto_axes = bool(axes.auto_axes(shape))
        rules = variables.rules_on(tensor.rules_from(config), shape)
        constrain = (
            tensor.Constrain(rules, variables.joins(shape, model)) if self.auto_axes else None
        )
        self.layouts, self.chunks, self.programs_of = [], [], []
        groups = self.noise_groups()
        self.measure = isinstance(groups, int)  # the noise scale's norms too
        # an adapting rate: the norms' batch sizes, for the optimizer (chunks.py); a run that
        # adapts but measures nothing is refused by run_setup before anything is built
        big = config.global_batch_size
        adapting = self.rate.adaptation != "none" and self.measure
        self.adapt = (big / groups, big) if adapting else None
        for c in range(self.num_chunks):
            layers = slice(self.bounds[c], self.bounds[c + 1])
            specs = variables.specs(model, rules, shape, layers)
            rule = sync.build(self.sync, self.replicas, tx, specs)
            lay = ChunkLayout(model, tx, rule, self.meshes[self.stage_of[c]], layers, self.measure)
            chunk = Chunk(
                c,
                self.stage_of[c],
                layers,
                c == 0,
                c == self.num_chunks - 1,
                lay.mesh,
                model,
                rule,
                self.replicas,
                self.num_microbatches,
                self.auto_axes,
                constrain,
                lay.state_specs,
                lay.acc_specs,
                variables.gather_fn(specs["params"], shape),
                self.measure,
                self.adapt,
            )
            self.layouts.append(lay)
            self.chunks.append(chunk)
            self.programs_of.append(ChunkPrograms(chunk))
        if config.sync.mode != "allreduce":
            self.name = f"pipeline ({config.sync.mode})"
        # Which stages own a device of this process (all of them in one process), and the
        # mover for transfers that cross processes.
        self.multi = jax.process_count() > 1
        self.local_stages = [transfer.owns(m.devices) for m in self.meshes]
        self.lone_stages = [transfer.lone(m.devices) for m in self.meshes]
        self.mover = transfer.Mover(mesh, self.inflight) if self.multi else None
        self.microbatch_rows = config.global_batch_size // self.num_microbatches
        self._boundaries: dict = {}
        self.runner = Runner(self)
        self._compiled = False

    def noise_groups(self) -> int | str:
        """The micro-batches times the data replicas of a stage: each (micro-batch, replica)
        is a small batch (put_batch says which rows), under a rule that combines the replicas'
        gradients every step; each chunk measures its layers' part (chunks.py), under fsdp
        squared in each sharded layer's backward before its reduce-scatter."""
        combines = sync.MODES[self.sync.mode].combines
        reason = norms.why_not_measured(
            self.measures_noise, self.sync, self.model, combines, self.data
        )
        if reason:
            return reason
        groups = self.num_microbatches * self.data
        if groups == 1:
            fix = "--config.pipeline.num_microbatches=2 (or more)"
            if self.schedule == "naive":  # which runs one micro-batch
                fix = f"--config.pipeline.schedule=1f1b (or gpipe) and {fix}"
            return (
                f"one replica and one micro-batch give one gradient size; set {fix} to "
                "measure the noise scale"
            )
        return groups

    # -- state ------------------------------------------------------------------------------

    def _each_chunk(self, fn) -> tuple[tuple, tuple]:
        """(states, accumulators) from fn(chunk) -> (state, acc), None off this process."""
        parts = [
            fn(c) if self.local_stages[self.stage_of[c]] else (None, None)
            for c in range(self.num_chunks)
        ]
        return tuple(p[0] for p in parts), tuple(p[1] for p in parts)

    def place(self, host_state):
        """Split a canonical state by chunk and put each part on its stage's devices in its
        rule's layout; gradient accumulators start at zero."""
        return PipelineState(*self._each_chunk(lambda c: self.layouts[c].place(host_state)))

    def canonical(self, state: PipelineState):
        """The layout-free state, as on a single device. With several processes each chunk's
        part is first gathered onto every device (one collective per chunk, which every
        process calls), so that every process holds the whole state, as Orbax needs."""
        parts = list(state.chunks)
        if self.multi:
            parts = [
                self.mover.gather_tree(st, lay.device_shapes, self.stage_of[c], lay.state_specs)
                for c, (st, lay) in enumerate(zip(parts, self.layouts))
            ]
        return merge([lay.canonical(st) for lay, st in zip(self.layouts, parts)])

    def canonical_shapes(self):
        return merge([lay.canonical_shapes for lay in self.layouts])

    def state_shapes(self):
        states, accs = zip(*(lay.abstract() for lay in self.layouts))
        return PipelineState(tuple(states), tuple(accs))

    def chunk_state_shapes(self, c: int) -> tuple:
        return self.layouts[c].abstract()

    def stage_states(self, state):
        """Per device stage, its chunks' (state, gradient accumulator) pairs."""
        chunks = list(zip(state.chunks, state.grad_acc))
        return [[pair for pair, d in zip(chunks, self.stage_of) if d == s] for s in range(self.k)]

    # -- batches ----------------------------------------------------------------------------

    def batch_share(self) -> tuple[int, int]:
        """Every process reads the whole global batch: stage 0's devices need the images and
        the last stage's the labels, whichever processes those are (each keeps its rows)."""
        return 0, 1

    def _home(self, key: str) -> int:
        # images: the first chunk's stage; labels and the eval mask: the last chunk's
        return self.stage_of[0] if key == "image" else self.stage_of[-1]

    def put_batch(self, local_batch):
        """Split the global batch into M micro-batches, each sharded over its stage's batch axes.

        Data replica r trains on the same rows as under data parallelism (its share, the r-th
        1/d of the global batch), in M micro-batches: micro-batch m holds the m-th 1/M of every
        replica's share. So per-replica sync modes see the same data on any mesh, and with one
        replica micro-batch m is simply the m-th 1/M of the batch."""
        out = {}
        d, m = self.data, self.num_microbatches
        for key, value in local_batch.items():
            s = self._home(key)
            grouped = np.reshape(value, (d, m, -1, *value.shape[1:])).swapaxes(0, 1)
            parts = [np.reshape(g, (-1, *value.shape[1:])) for g in grouped]
            out[key] = [
                mesh_lib.put(p, self.batch_sharding[s]) if self.local_stages[s] else None
                for p in parts
            ]
        return out

    def batch_shapes(self, batch_size, eval=False):
        rows = batch_size // self.num_microbatches
        keys = {
            "image": ((rows, *self.model.input_shape), jnp.float32),
            "label": ((rows,), jnp.int32),
        }
        if eval:
            keys["mask"] = ((rows,), jnp.float32)
        return {
            key: [jax.ShapeDtypeStruct(shape, dtype, sharding=self.batch_sharding[self._home(key)])]
            * self.num_microbatches
            for key, (shape, dtype) in keys.items()
        }

    def boundary(self, rows: int) -> list[jax.ShapeDtypeStruct]:
        """Per chunk, its output for a micro-batch of `rows` images (shapes.boundary_shapes)."""
        if rows not in self._boundaries:
            self._boundaries[rows] = shapes.boundary_shapes(self.model, self.chunks, rows)
        return self._boundaries[rows]

    # -- steps ------------------------------------------------------------------------------

    def _compile(self, state, batch):
        """Compile every chunk program by running one step on a throwaway copy of the state."""
        copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))  # one program per chunk
        scratch = PipelineState(
            tuple(copy(st) for st in state.chunks), tuple(copy(a) for a in state.grad_acc)
        )
        jax.block_until_ready(self.train_step(scratch, batch))

    def train_step(self, state, batch):
        st, acc, metrics = self.runner.train_step(state.chunks, state.grad_acc, batch)
        return PipelineState(tuple(st), tuple(acc)), metrics

    def eval_step(self, state, batch):
        return self.runner.eval_step(state.chunks, batch)

    @property
    def peak_stash_bytes(self) -> list[int]:
        return self.runner.peak_stash_bytes

    # -- what a step runs -------------------------------------------------------------------

    # -- what a step runs (accounting.py) ---------------------------------------------------

    def programs(self, batch_shapes):
        return accounting.programs(self, batch_shapes)

    @property
    def num_stages(self) -> int:
        return self.k

    def schedule_events(self):
        return self.events

    def analytic_bubble(self) -> float:
        return schedules.analytic_bubble(
            self.k, self.num_microbatches, self.schedule, self.virtual_stages
        )

    def boundary_bytes(self, batch_size: int) -> list[int]:
        return accounting.boundary_bytes(self, batch_size)

    def bytes_between_stages(self, batch_size: int) -> int:
        """Stage-to-stage bytes per step: every boundary's activations forward and their
        gradients back, for the whole global batch (in the dtype carried)."""
        return sum(self.boundary_bytes(batch_size))

    def sent_bytes_per_device(self, batch_size: int) -> list[int]:
        return accounting.sent_bytes_per_device(self, batch_size)

    def stored_activation_bytes(self, batch_size: int) -> list[int]:
        return accounting.stored_activation_bytes(self, batch_size)

    def describe(self, batch_size: int) -> str:
        return accounting.describe(self, batch_size)
