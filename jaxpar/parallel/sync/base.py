"""What every synchronisation rule shares: the interface, and the layout helpers.

A rule decides how the data replicas of one model part (the whole model, or one pipeline
chunk) agree. It is the only place where gradients or parameters are combined across
replicas, and it owns three things:

- the *device layout* (`to_device`, `specs`): leaves replicated over the replica axes (the
  batch axes: data, or node x data, ...), leaves with a leading replica axis split over them,
  or (`sharded`) optimizer state split over them along one dimension. Every leaf also keeps
  its split over the other axes (`variable_specs`: tensor by the sharding rules, fsdp's
  parameter shards): a rule adds the replica axes to those specs.
- the *canonical form* (`canonical`, `from_shared`): what checkpoints store. Modes whose
  replicas agree after every step store the single-device state; modes whose replicas drift
  (`local_sgd`, `independent`) store every replica along a leading axis, and `async` adds its
  pending gradients under `state.sync`.
- the *update* inside the step body (`update`): the replica's gradient in, the combined
  update applied (TrainState.apply_gradients, the one update rule), the new state out.

The step body around it is the strategy's: `local_params`/`local_stats` give what a replica
computes with, `state.loss_and_grads` takes the gradient, `metrics` reports. Every collective
goes through `Replicas` (parallel/replicas.py), so a rule runs unchanged with one replica.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from jaxpar import adascale
from jaxpar.errors import ConfigError
from jaxpar.mesh import is_spec, spec_axes
from jaxpar.parallel.replicas import Replicas
from jaxpar.parallel.state import TrainState
from jaxpar.run_spec import SyncSpec


class SyncRule:
    """Base rule (replicated state); subclasses override what differs.

    `variable_specs`: {"params": ..., "batch_stats": ...} PartitionSpecs of the part's
    variables over the other mesh axes (all `P()` without tensor parallelism or fsdp)."""

    name = "?"
    eval_kind = "shared"  # shared: every replica holds the model; average; each: per replica
    per_replica_metrics = False  # metrics come back as [replicas] (no collective in the step)
    impls = ("shard_map",)  # sync.impl values the rule runs under
    # Why the rule cannot run beside a tensor axis or pipeline stages; None: it can.
    refuses_tensor: str | None = None
    refuses_stages: str | None = None
    # Whether the update applies one combined gradient of this step's replicas (allreduce,
    # parameter_server, sharded): then `update_measured` reports its squared norm, the noise
    # scale's big batch (noise_scale.py). Rules whose replicas step apart, or on stale
    # gradients, form none.
    combines = False

    def __init__(self, settings: SyncSpec, replicas: Replicas, tx, variable_specs: dict):
        self.settings, self.replicas, self.tx = settings, replicas, tx
        self.num_replicas = replicas.count
        self.variable_specs = variable_specs
        global_bn = settings.batch_norm == "global" and self.num_replicas > 1
        self.bn_axis_name = replicas.axes if global_bn else None

    @classmethod
    def check(cls, config, data: int) -> str | None:
        """A one-line reason this config cannot run the mode, or None."""
        return None

    # --- layouts -------------------------------------------------------------------------
    @property
    def identity_layout(self) -> bool:
        """Whether the device layout is the canonical one (`to_device` and `canonical` as
        here): placing a state is then a transfer, with no program to compile."""
        rule = type(self)
        return rule.to_device is SyncRule.to_device and rule.canonical is SyncRule.canonical

    def from_shared(self, state: TrainState) -> TrainState:
        """The canonical form of a run that starts from one shared model."""
        return state

    def fit(self, host_state: TrainState, canonical_shapes: TrainState) -> TrainState:
        """A canonical host state of another run, if it fits this rule's `canonical_shapes`:
        one shared model starts per-replica modes on every replica. Anything else is a
        one-line error."""
        want = _shapes(canonical_shapes)
        if _shapes(host_state) == want:
            return host_state
        shared = host_state.replace(sync={})
        if _shapes(jax.eval_shape(self.from_shared, shared)) == want:
            return jax.tree.map(np.asarray, self.from_shared(shared))
        raise ConfigError(
            f"the checkpoint's state does not fit sync.mode={self.name} with "
            f"{self.num_replicas} replicas (it was written by another mode or replica "
            "count); resume with the settings it was written with"
        )

    def to_device(self, canonical: TrainState) -> TrainState:
        """Canonical -> device layout (global shapes). Jit-able."""
        return canonical

    def canonical(self, state: TrainState) -> TrainState:
        """Device layout -> canonical. Jit-able."""
        return state

    def specs(self, device_shapes: TrainState) -> TrainState:
        """PartitionSpecs of the device layout over every mesh axis: the variables' own
        (tensor, fsdp) specs, replicated over the replica axes unless the rule says
        otherwise."""
        params = self.variable_specs["params"]
        return device_shapes.replace(
            step=P(),
            params=params,
            batch_stats=self.variable_specs["batch_stats"],
            opt_state=self.like_params(device_shapes.opt_state, params),
            sync=jax.tree.map(lambda _: P(), device_shapes.sync),
        )

    def like_params(self, opt_shapes, param_specs):
        """Specs for an optimizer state: its params-shaped parts take `param_specs`,
        anything else (step counts) is replicated."""
        replicated = jax.tree.map(lambda _: P(), opt_shapes)
        return optax.tree_map_params(
            self.tx,
            lambda _, s: s,
            replicated,
            param_specs,
            transform_non_params=lambda _: P(),
            is_leaf=is_spec,
        )

    # --- inside the step body --------------------------------------------------------------
    def local_params(self, state: TrainState):
        """The parameters this replica computes with, per device (see Replicas.varying)."""
        return self.replicas.varying(state.params)

    def local_stats(self, stats):
        """The BatchNorm statistics this replica computes with (from the placed ones)."""
        return stats

    def placed_stats(self, stats):
        """A replica's statistics back in the placed layout (inverse of `local_stats`)."""
        return stats

    def eval_model(self, state: TrainState):
        """The (params, batch_stats) this replica evaluates."""
        return state.params, state.batch_stats

    def update(self, state: TrainState, grads, stats) -> TrainState:
        """Combine this replica's `grads` with the others' and apply them; `stats` are the
        replica's new BatchNorm statistics. A rule that `combines` defines `combine` and
        `apply` instead; the others override this."""
        if not self.combines:
            raise NotImplementedError(f"{type(self).__name__} defines no update")
        return self.update_measured(state, grads, stats)[0]

    def update_measured(
        self, state: TrainState, grads, stats, noise=None
    ) -> tuple[TrainState, Any]:
        """`update`, and the squared norm of the combined gradient it applied (the same
        scalar on every replica), or None for a rule that forms none (`combines`). `noise`:
        an adascale.GradNoise without its sq_big, which this completes and hands to the
        optimizer (a rule that forms no combined gradient cannot take one)."""
        if not self.combines:
            if noise is not None:
                raise ValueError(f"sync.mode={self.name} forms no combined gradient")
            return self.update(state, grads, stats), None
        combined, big = self.combine(state, grads)
        noise = noise._replace(sq_big=big) if noise is not None else None
        return self.apply(state, combined, stats, noise), big

    def combine(self, state: TrainState, grads) -> tuple[Any, jax.Array]:
        """This replica's `grads` combined with the others' as the rule does (its
        collectives), and the combined gradient's squared norm, the same on every replica.
        Only a rule that `combines`."""
        raise NotImplementedError(f"{type(self).__name__} forms no combined gradient")

    def apply(self, state: TrainState, combined, stats, noise=None) -> TrainState:
        """The optimizer step on what `combine` returned; `stats` are the replica's new
        BatchNorm statistics and `noise` the step's gradient norms for an adapting rate."""
        raise NotImplementedError(f"{type(self).__name__} forms no combined gradient")

    def adapted(self, state: TrainState):
        """The adapting rate's state (adascale.AdaScaleState: the gain and progress) after
        an update, the same on every replica, or None without one."""
        return adascale.find(state.opt_state)

    @property
    def manual_axes(self) -> tuple[str, ...]:
        """The axes the step body is manual over (where collectives are explicit)."""
        return self.replicas.axes if self.replicas.manual else ()

    def metrics(self, loss, accuracy) -> dict:
        if self.per_replica_metrics:
            return {"loss": loss[None], "accuracy": accuracy[None]}
        return self.replica_mean({"loss": loss, "accuracy": accuracy})

    # --- shared pieces -------------------------------------------------------------------
    def shared_stats(self, stats):
        """Per-replica BatchNorm running averages are averaged so replicas stay identical."""
        return self.replica_mean(stats) if self.bn_axis_name is None and stats else stats

    def replica_mean(self, tree):
        """The mean over the replicas of values that go straight out of the step (statistics,
        metrics): a sum of values already divided by the replicas (exact for a power of
        two), so the division joins the kernel that computes each value. A pmean divides
        after its all-reduce, and XLA:GPU slices its combined all-reduce apart after fusion
        (all-reduce-contiguous), so each leaf's division was a kernel of its own (Inception-v3
        on 8 GPUs: 188). Gradients keep `mean_grads`: their division joins the update."""
        n = self.num_replicas
        return self.replicas.psum(jax.tree.map(lambda x: x / n, tree)) if n > 1 else tree


def stack(tree: Any, num_replicas: int, xp: Any = jnp) -> Any:
    """A leading replica axis of `num_replicas` copies (`xp`: jax.numpy, or numpy on the
    host)."""
    return jax.tree.map(lambda x: xp.broadcast_to(x, (num_replicas, *xp.shape(x))), tree)


def block(tree: Any) -> Any:
    """Inside the step, a replica-stacked leaf arrives as a [1, ...] block: drop that axis."""
    return jax.tree.map(lambda x: x[0], tree)


def unblock(tree: Any) -> Any:
    return jax.tree.map(lambda x: x[None], tree)


def stacked(specs: Any, replicas: Replicas) -> Any:
    """Specs of replica-stacked leaves: the replica axes a leaf is not split over already on
    the new leading axis, then the leaf's own."""

    def one(s: P) -> P:
        lead = tuple(a for a in replicas.axes if a not in spec_axes(s))
        return P(lead or None, *s)

    return jax.tree.map(one, specs, is_leaf=is_spec)


def stacked_size(spec: P, replicas: Replicas) -> int:
    """The leading axis' length of a leaf stacked by `stacked`."""
    size = 1
    for a in replicas.axes:
        if a not in spec_axes(spec):
            size *= replicas.sizes[a]
    return size


def manual(specs: Any, replicas: Replicas) -> Any:
    """The replica-axes part of specs only: what shard_map's in/out specs name when the other
    axes are left to the sharding rules."""
    names = set(replicas.axes)

    def keep(spec: P) -> P:
        parts = []
        for p in spec:
            group = p if isinstance(p, tuple) else (p,) if p else ()
            mine = tuple(a for a in group if a in names)
            parts.append(mine if len(mine) > 1 else mine[0] if mine else None)
        while parts and parts[-1] is None:
            parts.pop()
        return P(*parts)

    return jax.tree.map(keep, specs, is_leaf=is_spec)


def _shapes(tree) -> Any:
    """The tree's leaves' shapes (host arrays, device arrays or ShapeDtypeStructs alike)."""
    return jax.tree.map(lambda x: tuple(np.shape(x)), tree)
