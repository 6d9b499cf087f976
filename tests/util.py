"""Shared test helpers: tiny configs and a driver that runs real training steps."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs import base
from jaxpar import configfile, trainer
from jaxpar.parallel.state import forward_loss, init_state


def tiny_config(**overrides):
    """A VGG small enough for 2 CPU cores, on synthetic 32x32 data."""
    config = base.get_config()
    config.model.name = "vgg11"
    config.model.width = 1 / 16  # channels 4 .. 32
    config.model.batch_norm = False
    config.global_batch_size = 16
    config.num_train_steps = 3
    config.learning_rate = 0.05
    config.warmup_steps = 0
    config.lr_schedule = "constant"
    config.data.name = "synthetic"
    config.data.image_shape = (32, 32, 3)
    config.data.num_train = 64
    config.data.num_eval = 20
    config.log_every_steps = 1
    config.eval_every_steps = 0
    return override(config, overrides)


def override(config, overrides: dict):
    """Set dotted keys ("model.width") on a ConfigDict, as --config.KEY=VALUE would (a test may
    add a key the config lacks)."""
    return configfile.override(config, overrides, new_keys=True)


def run_steps(config, num_devices: int, steps: int | None = None):
    """Run `steps` real training steps on the first `num_devices` devices.

    Returns (losses per step, canonical final state) on the host.
    """
    s = trainer.setup(config, jax.devices()[:num_devices])
    state = s.strategy.init_state(jax.random.key(config.seed))
    losses = []
    for i in range(steps or config.num_train_steps):
        batch = s.strategy.put_batch(trainer.local_train_batch(s, i))
        state, metrics = s.strategy.train_step(state, batch)
        losses.append(float(metrics["loss"]))
    return np.array(losses), jax.device_get(s.strategy.canonical(state))


def reference_run(config, steps: int | None = None, microbatches: int = 1):
    """The single-device program, written plainly: jit(grad + optax) with no mesh at all.

    Every partitioning is held to this. With `microbatches` > 1 it is the documented
    micro-batching policy: the batch is split in M equal parts, each normalised with its own
    BatchNorm statistics and updating the running averages in order; the step's loss and
    gradient are the means over the parts, applied once. Part m holds the m-th 1/M of every
    data replica's share of the batch (config.mesh_shape's data size; with one replica, the
    m-th 1/M of the batch), as a pipeline's micro-batch does.
    Returns (losses per step, final state) on the host.
    """
    replicas = max(int(config.mesh_shape[0]), 1)
    config = config.copy_and_resolve_references()
    config.mesh_shape = (1, 1, 1)
    s = trainer.setup(config, jax.devices()[:1])
    model, tx = s.model, s.strategy.tx
    # jit, as every strategy initialises: eager initialisers round some parameters 1 ulp
    # differently, which a chaotic model (ResNet-50 at width 1/16) grows to 1e-2 in 3 steps
    state = jax.jit(functools.partial(init_state, model, tx))(jax.random.key(config.seed))

    @jax.jit
    def step(state, batch):
        grad_fn = jax.value_and_grad(functools.partial(forward_loss, model), has_aux=True)
        stats, loss, grads = state.batch_stats, 0.0, None
        for part in range(microbatches):
            size = len(batch["label"]) // microbatches
            mb = jax.tree.map(
                lambda v, part=part, size=size: v[part * size : (part + 1) * size], batch
            )
            (mb_loss, (stats, _)), mb_grads = grad_fn(state.params, stats, mb)
            loss = loss + mb_loss / microbatches
            scaled = jax.tree.map(lambda g: g / microbatches, mb_grads)
            grads = scaled if grads is None else jax.tree.map(jnp.add, grads, scaled)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new = state.replace(
            step=state.step + 1, params=params, batch_stats=stats, opt_state=opt_state
        )
        return new, loss

    def grouped(v):  # replica r's rows, micro-batch by micro-batch
        parts = np.reshape(v, (replicas, microbatches, -1, *v.shape[1:])).swapaxes(0, 1)
        return np.reshape(parts, v.shape)

    losses = []
    for i in range(steps if steps is not None else config.num_train_steps):
        batch = jax.tree.map(grouped, trainer.local_train_batch(s, i))
        state, loss = step(state, batch)
        losses.append(float(loss))
    return np.array(losses), jax.device_get(state)


def max_rel_error(got, ref, floor: float = 1e-3) -> float:
    """Largest leaf-wise max|got - ref| / max(max|ref|, floor) over two pytrees.

    The floor keeps leaves that are pure rounding noise from dividing by ~0: a conv bias
    followed by BatchNorm has a gradient of exactly zero in exact arithmetic, so it stays at
    ~1e-9 and its "relative" error means nothing. Real parameters are far above the floor.
    """
    errors = jax.tree.map(
        lambda a, b: (
            float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
            / max(float(np.max(np.abs(np.asarray(b)))), floor)
        ),
        got,
        ref,
    )
    return max(jax.tree.leaves(errors), default=0.0)
