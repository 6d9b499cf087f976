"""The train state, the one update rule, the one loss and the one gradient path.

Every strategy and synchronisation rule trains through these: `loss_and_grads` (a replica's
loss, new BatchNorm statistics, accuracy and gradient, nothing reduced) and
`TrainState.apply_gradients` (the optimizer step, shaped like flax's
`train_state.TrainState.apply_gradients`). How replicas combine gradients is the sync rule's
business alone (parallel/sync/).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

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

    def apply_gradients(
        self, tx: optax.GradientTransformation, grads, noise=None, **changes
    ) -> TrainState:
        """The update rule: one optimizer step on `grads` (already combined as the sync rule
        says), the step count advanced; `changes` replace other fields (batch_stats, ...).
        `noise` (adascale.GradNoise, the step's two squared gradient norms) goes to an
        optimizer that adapts its rate to it (lr_adaptation=adascale)."""
        extra = {} if noise is None else {"noise": noise}
        updates, opt_state = tx.update(grads, self.opt_state, self.params, **extra)
        params = optax.apply_updates(self.params, updates)
        return self.replace(step=self.step + 1, params=params, opt_state=opt_state, **changes)


def init_state(
    model: SequentialModel, tx: optax.GradientTransformation, rng, layers: slice = slice(None)
) -> TrainState:
    """A fresh state of `model`'s `layers` (all of them, or one pipeline chunk's)."""
    return _fresh(model.init(rng, layers), tx)


def state_shapes(
    model: SequentialModel, tx: optax.GradientTransformation, layers: slice = slice(None)
) -> TrainState:
    """`init_state`'s result as shapes and dtypes, from the layers' traced programs (the
    model is not traced again; only the optimizer's init is)."""
    return jax.eval_shape(functools.partial(_fresh, tx=tx), model.variable_shapes(layers))


def _fresh(variables: dict, tx: optax.GradientTransformation) -> TrainState:
    """The state at step 0 around freshly initialised variables."""
    params = variables["params"]
    return TrainState(jnp.zeros((), jnp.int32), params, variables["batch_stats"], tx.init(params))


@functools.cache
def _init_program(model: SequentialModel):
    """`model.init` of every layer, jitted once per model: the one program that draws the
    initial parameters of every partitioning of it."""
    return jax.jit(model.init)


def host_init_state(model: SequentialModel, tx: optax.GradientTransformation, rng) -> TrainState:
    """A fresh canonical state on the host, as one device computes it. Every strategy starts
    from it (`Strategy.init_state` places it, as a restore does), so any two partitionings
    of a model start from the same values by construction, and the program that draws them
    does not depend on the mesh: it compiles once per model (and the compile cache holds it
    for every later run of the model, on any mesh)."""
    rng = jax.device_put(rng, jax.local_devices()[0])
    return jax.device_get(_fresh(_init_program(model)(rng), tx))


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy over the (local) batch."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return jnp.mean(jnp.argmax(logits, -1) == labels)


def forward_loss(
    model: SequentialModel,
    params,
    batch_stats,
    batch,
    *,
    bn_axis_name=None,
    constrain=None,
    gather=None,
) -> tuple[jax.Array, tuple[Any, jax.Array]]:
    """Training-mode loss on `batch`; aux = (updated batch stats, accuracy)."""
    logits, new_stats = model.apply(
        params,
        batch_stats,
        batch["image"],
        train=True,
        bn_axis_name=bn_axis_name,
        constrain=constrain,
        example=batch.get("example"),
        gather=gather,
    )
    return cross_entropy(logits, batch["label"]), (new_stats, accuracy(logits, batch["label"]))


def loss_and_grads(model, params, batch_stats, batch, **options):
    """This replica's (loss, new batch statistics, accuracy, gradient): nothing is reduced
    across replicas here. `params` must be per-replica values inside shard_map (see
    sync/base.py) for the gradient to stay local. `options` as `measured_loss_and_grads`
    takes them, without the noise scale's."""
    return measured_loss_and_grads(model, params, batch_stats, batch, **options)[:4]


def measured_loss_and_grads(
    model,
    params,
    batch_stats,
    batch,
    *,
    bn_axis_name=None,
    constrain=None,
    chunks: int = 1,
    gather=None,
    slice_sq=None,
    probe=None,
):
    """`loss_and_grads`, and, given `slice_sq` (a function of a gradient: its squared norm,
    parallel/norms.py), the mean over the slices of each slice's gradient's squared norm (the
    replica's gradient's when `chunks` is 1), for the noise scale, else None.

    With parameters sharded (`gather`, fsdp) their gradients arrive summed over the replicas,
    so a replica's own is squared inside each layer's backward instead: give `probe` (a zero
    scalar varying over the replica axes, variables.Gathered.probed) and the sharded leaves'
    part of that squared norm is the loss's derivative with respect to it; `slice_sq` takes
    the leaves left whole.

    `chunks` > 1 accumulates the gradient over that many equal slices of the batch, one after
    another (a lax.scan): the same mean loss, gradient and accuracy, with a working set
    `chunks` times smaller (gradient accumulation). Dropout masks follow the rows' example ids,
    so they do not change; BatchNorm statistics would (per slice), so callers refuse it there.
    The scan is unrolled: XLA's CPU backend runs convolutions inside a while loop several
    times slower than the same ones in straight-line code (time a LeNet step of 512 rows in
    32 slices on one device with `unroll` True and False to see it).
    """
    loss_fn = functools.partial(forward_loss, model, bn_axis_name=bn_axis_name, constrain=constrain)
    if probe is None or gather is None or slice_sq is None:
        value_and_grad = jax.value_and_grad(functools.partial(loss_fn, gather=gather), has_aux=True)

        def grad_fn(params, batch_stats, batch):
            out, grads = value_and_grad(params, batch_stats, batch)
            return out, grads, None if slice_sq is None else slice_sq(grads)

    else:
        probed = jax.value_and_grad(
            lambda p, probe, s, b: loss_fn(p, s, b, gather=gather.probed(probe)),
            argnums=(0, 1),
            has_aux=True,
        )

        def grad_fn(params, batch_stats, batch):
            out, (grads, sharded_sq) = probed(params, probe, batch_stats, batch)
            return out, grads, sharded_sq + slice_sq(gather.whole(grads))

    if chunks == 1:
        (loss, (stats, acc)), grads, sq = grad_fn(params, batch_stats, batch)
        return loss, stats, acc, grads, sq
    sliced = jax.tree.map(lambda x: x.reshape(chunks, x.shape[0] // chunks, *x.shape[1:]), batch)

    def one(total, part):
        (loss, (_, acc)), grads, sq = grad_fn(params, batch_stats, part)
        return jax.tree.map(jnp.add, total, grads), (loss, acc, jnp.zeros(()) if sq is None else sq)

    zero = jax.tree.map(jnp.zeros_like, params)  # keeps the params' per-device type
    grads, (loss, acc, sq) = jax.lax.scan(one, zero, sliced, unroll=True)
    grads = jax.tree.map(lambda g: g / chunks, grads)
    loss, acc = jnp.mean(loss), jnp.mean(acc)
    return loss, batch_stats, acc, grads, None if slice_sq is None else jnp.mean(sq)


def logit_sums(logits, labels, mask) -> dict[str, jax.Array]:
    """Masked sums of cross-entropy and correct predictions (padding rows have mask 0)."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
    return {
        "loss_sum": jnp.sum(losses * mask),
        "correct": jnp.sum(correct * mask),
        "count": jnp.sum(mask),
    }


def eval_sums(
    model: SequentialModel, params, batch_stats, batch, constrain=None, gather=None
) -> dict:
    """Masked sums of loss and correct predictions over a (local) eval batch."""
    logits, _ = model.apply(
        params, batch_stats, batch["image"], train=False, constrain=constrain, gather=gather
    )
    return logit_sums(logits, batch["label"], batch["mask"])


@jax.jit
def add_sums(a: dict, b: dict) -> dict:
    """Running eval sums plus one batch's, in one computation (dispatch.py counts each)."""
    return jax.tree.map(jnp.add, a, b)
