"""What every synchronisation rule shares: the interface, the local gradient, layout helpers.

A rule decides how data-parallel replicas agree. It owns three things:

- the *device layout* of the state (`to_device`, `specs`): replicated leaves (`P()`), leaves
  with a leading replica axis split over "data" (`P("data")`, one block per device), or flat
  shards of the optimizer state (`sharded`);
- the *canonical form* (`canonical`, `from_shared`): what checkpoints store. Modes whose
  replicas agree after every step store the single-device state; modes whose replicas drift
  (`local_sgd`, `independent`) store every replica along a leading axis, and `async` adds its
  pending gradients under `state.sync`;
- the *step body* (`step`), run per device inside `jax.shard_map` over "data".
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxpar.parallel.common import TrainState, forward_loss

AXIS = "data"


class SyncRule:
    """Base rule; subclasses override what differs. `n` = replicas (the data axis size)."""

    name = "?"
    eval_kind = "shared"  # shared: every replica holds the model; average; each: per replica
    per_replica_metrics = False  # metrics come back as [n] (no collective in the step)
    impls = ("shard_map",)  # sync.impl values the rule runs under
    allows_tensor = False  # can combine with a tensor axis > 1
    allows_stages = False  # can run on pipeline stages (stage axis > 1)

    def __init__(self, config, n: int, model, tx):
        self.config, self.n, self.model, self.tx = config, n, model, tx
        self.bn_axis_name = AXIS if config.sync.batch_norm == "global" else None

    @classmethod
    def check(cls, config, data: int) -> str | None:
        """A one-line reason this config cannot run the mode, or None."""
        return None

    # --- layouts -------------------------------------------------------------------------
    def from_shared(self, state: TrainState) -> TrainState:
        """The canonical form of a run that starts from one shared model."""
        return state

    def to_device(self, canonical: TrainState) -> TrainState:
        """Canonical -> device layout (global shapes). Jit-able."""
        return canonical

    def canonical(self, state: TrainState) -> TrainState:
        """Device layout -> canonical. Jit-able."""
        return state

    def specs(self, device_shapes: TrainState) -> TrainState:
        """PartitionSpecs of the device layout: replicated unless the rule says otherwise."""
        return jax.tree.map(lambda _: P(), device_shapes)

    def eval_model(self, state: TrainState):
        """Inside shard_map: the (params, batch_stats) this device evaluates."""
        return state.params, state.batch_stats

    # --- the step ------------------------------------------------------------------------
    def step(self, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        raise NotImplementedError

    # --- shared pieces -------------------------------------------------------------------
    def local_grads(self, params, batch_stats, batch, bn_axis_name=None):
        """This replica's loss, new batch statistics, accuracy and gradient (no reduction)."""
        grad_fn = jax.value_and_grad(
            functools.partial(forward_loss, self.model, bn_axis_name=bn_axis_name), has_aux=True
        )
        (loss, (stats, accuracy)), grads = grad_fn(params, batch_stats, batch)
        return loss, stats, accuracy, grads

    def shared_stats(self, stats):
        """Per-replica BatchNorm running averages are averaged so replicas stay identical."""
        return lax.pmean(stats, AXIS) if self.bn_axis_name is None and stats else stats

    def apply(self, grads, opt_state, params):
        updates, opt_state = self.tx.update(grads, opt_state, params)
        return jax.tree.map(jnp.add, params, updates), opt_state


def mean_metrics(loss, accuracy) -> dict:
    return {"loss": lax.pmean(loss, AXIS), "accuracy": lax.pmean(accuracy, AXIS)}


def stack(tree: Any, n: int) -> Any:
    """A leading replica axis of n copies."""
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *jnp.shape(x))), tree)


def block(tree: Any) -> Any:
    """Inside shard_map, a replica-stacked leaf arrives as a [1, ...] block: drop that axis."""
    return jax.tree.map(lambda x: x[0], tree)


def unblock(tree: Any) -> Any:
    return jax.tree.map(lambda x: x[None], tree)


def varying(tree: Any) -> Any:
    """Replicated values cast to per-device ones, so a gradient taken at them stays local."""
    return lax.pcast(tree, AXIS, to="varying")


def stacked_specs(tree: Any) -> Any:
    return jax.tree.map(lambda _: P(AXIS), tree)
