"""What every partitioning shares: the train state, the loss, and the Strategy interface."""

from __future__ import annotations

import abc
import functools
import time
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxpar import dispatch
from jaxpar.models import SequentialModel


@flax.struct.dataclass
class TrainState:
    """Everything a step reads and writes. Params are per layer: {layer_name: {...}}."""

    step: jax.Array
    params: Any
    batch_stats: Any
    opt_state: Any
    # What a synchronisation mode keeps between steps (parallel/sync/), e.g. async's pending
    # gradients; {} for modes that keep nothing. Part of the canonical (checkpointed) state.
    sync: Any = flax.struct.field(default_factory=dict)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy over the (local) batch."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def forward_loss(
    model: SequentialModel, params, batch_stats, batch, *, bn_axis_name=None, constrain=None
) -> tuple[jax.Array, tuple[Any, jax.Array]]:
    """Training-mode loss on `batch`; aux = (updated batch stats, accuracy)."""
    logits, new_stats = model.apply(
        params,
        batch_stats,
        batch["image"],
        train=True,
        bn_axis_name=bn_axis_name,
        constrain=constrain,
    )
    loss = cross_entropy(logits, batch["label"])
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
    return loss, (new_stats, accuracy)


def eval_sums(
    model: SequentialModel, params, batch_stats, batch, constrain=None
) -> dict[str, jax.Array]:
    """Masked sums of loss and correct predictions over a (local) eval batch."""
    logits, _ = model.apply(params, batch_stats, batch["image"], train=False, constrain=constrain)
    return logit_sums(logits, batch["label"], batch["mask"])


def logit_sums(logits, labels, mask) -> dict[str, jax.Array]:
    """Masked sums of cross-entropy and correct predictions (padding rows have mask 0)."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
    return {
        "loss_sum": jnp.sum(losses * mask),
        "correct": jnp.sum(correct * mask),
        "count": jnp.sum(mask),
    }


@jax.jit
def add_sums(a: dict, b: dict) -> dict:
    """Running eval sums plus one batch's, in one computation (dispatch.py counts each)."""
    return jax.tree.map(jnp.add, a, b)


def init_state(model: SequentialModel, tx: optax.GradientTransformation, rng) -> TrainState:
    variables = model.init(rng)
    params = variables["params"]
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        batch_stats=variables["batch_stats"],
        opt_state=tx.init(params),
    )


class Strategy(abc.ABC):
    """One way of splitting the training step over a mesh.

    A strategy places the state, puts host batches on devices with the right sharding, and
    compiles `train_step(state, batch) -> (state, metrics)` (state donated) and
    `eval_step(state, batch) -> sums`. `canonical(state)` returns the layout-free form
    (per-layer params, replicated), which is what tests compare and checkpoints store.
    """

    name: str = "?"

    def __init__(self, config, model: SequentialModel, mesh, tx):
        self.config, self.model, self.mesh, self.tx = config, model, mesh, tx
        self.compile_time_s = 0.0
        # Every dispatch loop (eval batches, pipeline events) registers its results here, so
        # that the CPU runtime never has too many collectives queued (see dispatch.py).
        self.inflight = dispatch.InFlight()
        self._train = self._eval = None

    @abc.abstractmethod
    def init_state(self, rng: jax.Array) -> TrainState: ...

    @abc.abstractmethod
    def put_batch(self, local_batch: dict) -> dict: ...

    def batch_share(self) -> tuple[int, int]:
        """Which share of every global batch this process reads, as (index, count): its own
        slice by default (each process feeds its devices' rows)."""
        return jax.process_index(), jax.process_count()

    @abc.abstractmethod
    def _jit_train(self): ...

    @abc.abstractmethod
    def _jit_eval(self): ...

    def canonical(self, state: TrainState) -> TrainState:
        return state

    def host_target(self) -> TrainState:
        """Zeros shaped like the canonical state on the host: what a checkpoint restores into."""
        shapes = jax.eval_shape(functools.partial(init_state, self.model, self.tx),
                                jax.random.key(0))  # fmt: skip
        return jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), shapes)

    @abc.abstractmethod
    def place(self, host_state: TrainState):
        """Put a canonical (layout-free, host) state on the mesh in this strategy's layout."""

    def compile(self, state: TrainState, batch: dict):
        """Ahead-of-time compile the train step for these shapes; record the time taken."""
        t0 = time.perf_counter()
        with self._mesh_context():  # sharding constraints inside resolve against the mesh
            self._train = self._jit_train().lower(state, batch).compile()
        self.compile_time_s = time.perf_counter() - t0
        return self._train

    @property
    def compiled(self):
        """The compiled train step (None before `compile`): what analysis reads."""
        return self._train

    def train_step(self, state: TrainState, batch: dict):
        if self._train is None:
            self.compile(state, batch)
        return self._train(state, batch)

    def eval_step(self, state: TrainState, batch: dict) -> dict:
        """One eval batch's sums: one computation, counted in the dispatch window."""
        if self._eval is None:
            self._eval = self._jit_eval()
        with self._mesh_context():
            return self.inflight.add(self._eval(state, batch))

    def _mesh_context(self):
        return jax.set_mesh(self.mesh)

    def describe(self, batch_size: int) -> str:
        """Lines about how this strategy splits the step (pipelines print their stages)."""
        return ""

    def report(self, state, batch, batch_size: int, timing: bool = True) -> dict[str, Any]:
        """The figures of one step (memory, collectives, stage transfers, bubble), with the
        same keys for every strategy: None where a figure does not apply. `timing=False`
        skips the figures that need timed runs (the measured pipeline bubble)."""
        from jaxpar import analysis  # analysis reads strategies, so it is imported late

        return analysis.report(self, state, batch, batch_size, timing)
