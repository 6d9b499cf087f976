"""The one protocol every way of splitting the training step implements, and what it exposes.

A strategy places the state, puts host batches on devices, runs `train_step(state, batch) ->
(state, metrics)` and `eval_step(state, batch) -> sums`, and converts to and from the
layout-free (canonical) state that checkpoints store. It also describes itself, without
running anything: `state_shapes()` and `batch_shapes(batch)` are abstract (shapes, dtypes and
shardings), and `programs(batch_shapes)` lists every compiled program of one training step,
where it runs, how often and in what role. That list is all that `analysis`, `explain`, the
bench and the predictor read: the trainer, the analysis and the predictor see the very same
programs, so nothing about a step is described twice.

Strategies without pipeline stages have one device stage: the pipeline facts below keep their
neutral values (one stage, no schedule, no bubble, nothing sent between stages).
"""

from __future__ import annotations

import abc
import dataclasses
import time
from typing import Any

import jax
import numpy as np

from jaxpar import axes, dispatch
from jaxpar.models import SequentialModel
from jaxpar.parallel.state import TrainState, host_init_state
from jaxpar.run_spec import DEFAULTS, RateRule, SyncSpec

# What a program does in the step (Program.role).
ROLES = ("train step", "forward", "backward", "backward input", "backward weights", "update")


def per_device_bytes(tree: Any) -> int:
    """Largest per-device share of a placed pytree, or of its abstract form (ShapeDtypeStruct
    leaves with shardings): read from the shardings, so any process can count any stage."""
    per: dict = {}
    for leaf in jax.tree.leaves(tree):
        sharding = leaf.sharding
        nbytes = int(np.prod(sharding.shard_shape(leaf.shape))) * np.dtype(leaf.dtype).itemsize
        for device in sharding.device_set:
            per[device] = per.get(device, 0) + nbytes
    return max(per.values()) if per else 0


def partitioning(
    shape: dict[str, int],
    schedule: str | None = None,
    sync_mode: str = "allreduce",
    chunks_per_stage: int = 1,
) -> str:
    """A mesh's split of the step in words, by what it composes ({axis: size} in mesh order):
    "1 device", "data parallel over 8", "pipeline over 2 stages (gpipe)", "tensor parallel
    over 8", "hybrid data 2 x pipeline 2 (1f1b) x tensor 2", "hybrid node 2 x data 4". A sync
    mode other than allreduce follows the last batch axis ("data 2 (local_sgd)"); chunks per
    stage follow the schedule."""
    sync = f" ({sync_mode})" if sync_mode and sync_mode != "allreduce" else ""
    how = f" ({schedule})" if schedule else ""
    if schedule and chunks_per_stage > 1 and schedule == "interleaved":
        how = f" ({schedule}, {chunks_per_stage} chunks per stage)"
    used = axes.used(shape)
    batch = [a for a in used if axes.get(a).role == "batch"]
    parts = []
    for name, n in used.items():
        axis = axes.get(name)
        after = sync if batch and name == batch[-1] else how if axis.role == "layers" else ""
        parts.append((f"{axis.label} {n}{after}", axis.phrase.format(n=n) + after))
    if not parts:
        return "1 device"
    if len(parts) == 1:
        return parts[0][1]
    return "hybrid " + " x ".join(short for short, _ in parts)


@dataclasses.dataclass(eq=False)
class Program:
    """One compiled program of a training step."""

    name: str  # the strategy's own name for it: "step", "fwd", "bwd", "bwd_in", ...
    role: str  # one of ROLES
    stage: int  # the device stage whose devices run it (0 without a pipeline)
    chunk: int  # the chunk of layers it computes (0 without a pipeline)
    mesh: Any  # the (sub-)mesh of its devices
    times: int  # calls per training step
    args: tuple  # abstract arguments: jax.ShapeDtypeStruct with shardings
    lowered: Any  # jax.stages.Lowered
    _compiled: Any = None

    @property
    def compiled(self):
        """XLA's compiled program (compiled on first use, from the abstract arguments)."""
        if self._compiled is None:
            self._compiled = self.lowered.compile()
        return self._compiled

    @property
    def num_devices(self) -> int:
        return int(self.mesh.devices.size)


class Strategy(abc.ABC):
    """One way of splitting the training step over a mesh; see the module docstring."""

    name: str = "?"
    # Pipeline facts, neutral without a pipeline: the schedule's name, micro-batches per step,
    # and the layer indices where chunks begin (0, ..., num_layers).
    schedule: str | None = None
    num_microbatches: int = 1
    bounds: tuple[int, ...] | None = None
    # Whether the step can accumulate gradients over `grad_accum_steps` slices of each
    # device's batch (data and tensor parallelism; a pipeline has its micro-batches).
    accumulates: bool = False

    @classmethod
    def check(cls, config, shape: dict[str, int]) -> str | None:
        """Why this strategy cannot run `config` on the mesh `shape` ({axis: size}, in mesh
        order; one line that says how to fix it), or None. Called before anything is
        built."""
        return None

    @classmethod
    def check_model(cls, config, shape: dict[str, int], model: SequentialModel) -> str | None:
        """Why this strategy cannot run `model` under `config` on the mesh `shape` (what only
        the model tells: channel counts that do not divide, too few layers to cut), or None.
        Called once the model is built, before anything is compiled or placed."""
        return None

    def __init__(self, config, model: SequentialModel, mesh, tx):
        self.config, self.model, self.mesh, self.tx = config, model, mesh, tx
        self.sync = SyncSpec.of_config(config)  # how its data replicas agree
        self.rate = RateRule.of_config(config)  # its optimiser's rate, adapting or not
        self.measures_noise = config.get("measure_noise_scale", DEFAULTS.measure_noise_scale)
        self.compile_time_s = 0.0
        # Every dispatch loop (eval batches, pipeline events) registers its computations here,
        # so that no device has too many queued (see dispatch.py).
        self.inflight = dispatch.InFlight()

    def partitioning(self) -> str:
        """How this strategy splits the step, in words (`partitioning`): the mesh's axes in
        use, the pipeline schedule and the sync mode, e.g. "hybrid data 2 x pipeline 2 (1f1b)
        x tensor 2". `name` is the implementation (config.strategy), this is what it does."""
        chunks = len(self.bounds) - 1 if self.bounds else 1
        return partitioning(
            dict(self.mesh.shape),
            self.schedule,
            self.sync.mode,
            chunks // max(self.num_stages, 1),
        )

    # -- state ------------------------------------------------------------------------------

    def init_state(self, rng: jax.Array):
        """A fresh state in this strategy's layout: the model's canonical initial state
        (state.host_init_state, the same for every mesh) placed as a restore places one."""
        return self.place(host_init_state(self.model, self.tx, rng))

    @abc.abstractmethod
    def place(self, host_state: TrainState):
        """Put a canonical (layout-free, host) state on the mesh in this strategy's layout."""

    @abc.abstractmethod
    def canonical(self, state) -> TrainState:
        """The layout-free state: per-layer parameters, as on one device (what checkpoints
        store and tests compare)."""

    @abc.abstractmethod
    def canonical_shapes(self) -> TrainState:
        """Shapes and dtypes of the canonical state."""

    @abc.abstractmethod
    def state_shapes(self):
        """The placed state, abstract: jax.ShapeDtypeStruct leaves with their shardings."""

    def host_target(self) -> TrainState:
        """Zeros shaped like the canonical state on the host: what a checkpoint restores into."""
        return jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), self.canonical_shapes())

    def stage_states(self, state) -> list[list[tuple[TrainState, Any]]]:
        """The placed state (or `state_shapes()`) grouped by device stage: per stage, a list of
        (TrainState, what else the stage keeps for it, e.g. a gradient accumulator)."""
        return [[(state, None)]]

    # -- batches ----------------------------------------------------------------------------

    def batch_share(self) -> tuple[int, int]:
        """Which share of every global batch this process reads, as (index, count): its own
        slice by default (each process feeds its devices' rows)."""
        return jax.process_index(), jax.process_count()

    @abc.abstractmethod
    def put_batch(self, local_batch: dict) -> dict:
        """This process's rows of a global batch, placed as the step consumes them."""

    @abc.abstractmethod
    def batch_shapes(self, batch_size: int, eval: bool = False) -> dict:
        """A placed global batch of `batch_size` images, abstract (what put_batch returns)."""

    # -- steps ------------------------------------------------------------------------------

    @abc.abstractmethod
    def train_step(self, state, batch) -> tuple[Any, dict]: ...

    @abc.abstractmethod
    def eval_step(self, state, batch) -> dict:
        """One eval batch's sums (loss_sum, correct, count), every computation counted in
        the dispatch window."""

    def compile(self, state, batch) -> None:
        """Compile the train step for these arguments (running it if need be); records
        `compile_time_s`. The state is left as it was."""
        t0 = time.perf_counter()
        self._compile(state, batch)
        self.compile_time_s = time.perf_counter() - t0

    @abc.abstractmethod
    def _compile(self, state, batch) -> None: ...

    # -- what a step runs -------------------------------------------------------------------

    @abc.abstractmethod
    def programs(self, batch_shapes: dict) -> list[Program]:
        """Every program of one training step on a batch of these shapes, lowered from
        abstract arguments (nothing is allocated or run)."""

    @property
    def num_stages(self) -> int:
        return 1

    def noise_groups(self) -> int | str:
        """How many equal small batches of the global batch the train step reports the mean
        squared gradient norm of (`grad_sq_small`, beside the whole batch's `grad_sq_big`, in
        its metrics: the gradient noise scale, noise_scale.py), or why it reports none, in one
        line."""
        return f"strategy {self.name} does not measure the gradient noise scale"

    def schedule_events(self) -> list | None:
        """Per device stage, its events in order (parallel/schedules.py); None: no pipeline."""
        return None

    def analytic_bubble(self) -> float | None:
        return None

    def conditional_period(self) -> int:
        """Steps between runs of the collectives its programs hold in conditional branches:
        local_sgd averages when the step count reaches a multiple of sync.period; 1 (every
        step) for every other sync mode."""
        return self.sync.period if self.sync.mode == "local_sgd" else 1

    def bytes_between_stages(self, batch_size: int) -> int | None:
        """Bytes crossing stage boundaries per step (activations and their gradients)."""
        return None

    def sent_bytes_per_device(self, batch_size: int) -> list[int]:
        """Per chunk, the bytes one of its devices sends to the next chunk per micro-batch
        (its output activation; the gradient comes back the same size)."""
        return [0]

    def stored_activation_bytes(self, batch_size: int) -> list[int] | None:
        """Per device stage, the activations (or residuals) one device keeps for the
        backward at the schedule's peak; None without a pipeline."""
        return None

    def describe(self, batch_size: int) -> str:
        """Lines about how this strategy splits the step (pipelines print their stages)."""
        return ""
