"""A run that diverged: whether a step's losses or a state's arrays are finite, and the one
line that stops the run, saying where its last good checkpoint is (hooks.py runs the checks
at each log line and before each save).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxpar.checkpoint import Checkpointer
from jaxpar.errors import TrainingError


def all_finite(tree) -> bool:
    """Whether every array of `tree` is finite: one compiled reduction per set of devices
    (a pipeline's stages hold their arrays on different devices)."""
    groups: dict[frozenset, list] = {}
    for leaf in jax.tree.leaves(tree):
        groups.setdefault(frozenset(leaf.sharding.device_set), []).append(leaf)
    flags = [_finite(arrays) for arrays in groups.values()]
    return bool(np.all(jax.device_get(flags)))


@jax.jit
def _finite(arrays: list) -> jax.Array:
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in arrays]))


def stop_if_diverged(fetched: list[dict], done: int, ckpt: Checkpointer | None) -> None:
    """Raise TrainingError if any loss of the last steps (ending at step `done`) is not finite."""
    losses = [float(m["loss"]) for m in fetched]
    bad = [j for j, value in enumerate(losses) if not np.isfinite(value)]
    if bad:
        step = done - len(losses) + 1 + bad[0]
        raise diverged(step, f"the loss ({losses[bad[0]]})", ckpt)


def diverged(step: int, what: str, ckpt: Checkpointer | None) -> TrainingError:
    """The one-line error of a run whose `what` is not finite at `step`."""
    if ckpt is None:
        where = "checkpoints are off, so nothing was saved"
    else:
        ckpt.wait()
        last = ckpt.latest_step()
        where = (
            f"the last good checkpoint is step {last} in {ckpt.directory} (a rerun resumes there)"
            if last is not None
            else "no checkpoint had been saved yet"
        )
    return TrainingError(
        f"training diverged: {what} is not finite at step {step}; {where}. Lower "
        "--config.learning_rate (or add warmup) and rerun"
    )
