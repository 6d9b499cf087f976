"""`fsdp`: fully sharded data parallelism (ZeRO stage 3; PyTorch FSDP, MaxText's fsdp axis).

A batch axis: the global batch is split over it as over `data`. In addition every parameter
is split over it along one dimension, and so are its gradient and its optimizer state: a
device keeps 1/f of each (f = the axis' size). Where a layer runs, inside its own
computation, its parameters are all-gathered over `fsdp` (`gather`); the layer runs under
`jax.checkpoint` with a policy that saves everything but the gathered parameters, so the
backward gathers them again instead of keeping them (a layer at a time, never the whole model
at once), and the gradient of a shard arrives reduce-scattered over `fsdp` (the all-gather's
transpose). With `data` beside it (HSDP) the shard's gradient is then averaged over `data`.
Per step and device: per parameter leaf two all-gathers of the whole leaf (forward, backward)
and one reduce-scatter of its gradient, P x (f-1)/f bytes received each.

Which dimension (`param_dim`): the first dimension whose logical name is in `PREFERRED`
(output channels and dense outputs first) that no other axis splits and that divides by f;
else the largest free dimension that divides. A leaf that divides nowhere (a 10-class bias
under f = 4, a 3-channel input's kernel row) stays whole on every fsdp device: its gradient
is averaged over `fsdp` like a data-parallel one (one all-reduce), and its optimizer state is
not split. `--explain` lists each leaf's layout.

It runs with `sync.mode=allreduce` (the other modes keep per-replica copies or split the
optimizer state themselves) and an elementwise optimizer (sgd, adam: a shard's update must
not depend on the rest of the leaf; LARS's per-layer norms would). BatchNorm statistics
stay whole (they are per channel, a few bytes) and global over every batch axis.
"""

from __future__ import annotations

from jax import lax

from jaxpar.axes.base import Axis, register

PREFERRED = ("conv_out", "mlp", "hidden", "embed", "classes", "conv_in")


class FSDP(Axis):
    def check(self, config, sizes, model=None):
        if sizes[self.name] == 1:
            return None
        if config.sync.mode != "allreduce":
            return (
                f"the {self.name} axis shards parameters and optimizer state itself; it "
                f"runs with sync.mode=allreduce, not {config.sync.mode}"
            )
        if config.sync.impl != "shard_map":
            return f"the {self.name} axis needs sync.impl=shard_map; pmap is data-parallel only"
        if config.optimizer.name not in ("sgd", "adam"):
            return (
                f"the {self.name} axis updates slices of each parameter, which needs an "
                f"elementwise optimizer (sgd, adam), not {config.optimizer.name}"
            )
        return None

    def param_dim(self, shape, names, taken, size):
        names = tuple(names) + (None,) * (len(shape) - len(names))
        free = [d for d, n in enumerate(shape) if not taken[d] and n % size == 0]
        for name in PREFERRED:
            for d in free:
                if names[d] == name:
                    return d
        return max(free, key=lambda d: shape[d]) if free else None

    def gather(self, x, dim):
        # Varying -> varying: the transpose is a reduce-scatter of the gradient over fsdp.
        return lax.all_gather(x, self.name, axis=dim, tiled=True)


FSDP_AXIS = register(
    FSDP(
        "fsdp",
        "batch",
        "the global batch, and every parameter, gradient and optimizer state (gathered per layer)",
        word="fsdp",
        phrase="fully sharded data parallel over {n}",
        shards_params=True,
    )
)
