"""Shared test helpers: tiny configs and a driver that runs real training steps."""

from __future__ import annotations

import jax
import numpy as np

from configs import base
from jaxpar import trainer


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
    for key, value in overrides.items():
        node = config
        *path, leaf = key.split(".")
        for part in path:
            node = node[part]
        node[leaf] = value
    return config


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


def max_rel_error(got, ref, floor: float = 1e-3) -> float:
    """Largest leaf-wise max|got - ref| / max(max|ref|, floor) over two pytrees.

    The floor keeps leaves that are pure rounding noise from dividing by ~0: a conv bias
    followed by BatchNorm has a gradient of exactly zero in exact arithmetic, so it stays at
    ~1e-9 and its "relative" error means nothing. Real parameters are far above the floor.
    """
    errors = jax.tree.map(
        lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        / max(float(np.max(np.abs(np.asarray(b)))), floor),
        got,
        ref,
    )
    return max(jax.tree.leaves(errors), default=0.0)
