"""Moving arrays between pipeline stages that live in different processes.

Within one process a stage-to-stage move is `jax.device_put`. Across processes (JAX's
multi-controller runtime, one process per host or GPU), no process can address the other side's
devices, so every move is a small SPMD program over the devices of both sides, run by every
process that owns one of them, in the same global order everywhere (a process that skipped one
would leave its peers waiting in the collective):

- `send`: stage a's activation (or gradient) to stage b. Both sides' shards are stacked along
  dim 0 into one array over the pair's mesh (the run's axes, the stage axis of size 2),
  sender blocks first; the receiving devices supply zero buffers. `lax.ppermute` over the
  stage axis moves each data replica's
  block to the same replica on the other side, and the received shards are re-wrapped as an
  array on stage b's devices. No copies besides the transfer itself.
- `gather`: an array held by stage s's devices made available on every device of the mesh (a
  psum over the stage axis of the stacked array, every other stage contributing zeros): the step's loss
  for logging on process 0, and the layout-free state that checkpoints store.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar import axes
from jaxpar import mesh as mesh_lib
from jaxpar.dispatch import InFlight


def owns(devices) -> bool:
    """Whether this process owns any of `devices`."""
    me = jax.process_index()
    return any(d.process_index == me for d in np.ravel(devices))


def lone(devices) -> bool:
    """Whether this process owns exactly one of `devices` and other processes the rest: a
    program over them is one a CPU client runs outside its order of collectives, which the
    dispatch loops wait for at once (`InFlight.settle`; docs/cluster.md, "Why dispatch is
    bounded")."""
    me = jax.process_index()
    flat = np.ravel(devices)
    return len(flat) > 1 and sum(d.process_index == me for d in flat) == 1


def _stacked_spec(spec: P, ndim: int, stage: str) -> P:
    """`spec` with the stage axis added as the major axis of dim 0 (dim 0 added for
    scalars)."""
    parts = list(spec) + [None] * (max(ndim, 1) - len(spec))
    first = parts[0]
    first = () if first is None else (first if isinstance(first, tuple) else (first,))
    return P((stage, *first), *parts[1:])


class Mover:
    """Cross-process moves over one mesh's stage slices; programs are compiled once per
    (stages, shape, dtype, spec) and zero buffers are cached (they are never donated).

    Every move and gather is one computation in the global program order: it is registered
    with `inflight` (dispatch.py) in a process that takes part and skipped in every other, so
    each method must be called by every process, in the same order."""

    def __init__(self, mesh: Mesh, inflight: InFlight):
        self.mesh = mesh
        self.stage = axes.stage_axis(dict(mesh.shape))
        self.position = mesh.axis_names.index(self.stage)
        self.inflight = inflight
        self.me = jax.process_index()
        self._zeros: dict = {}

    def _stage_devices(self, s: int) -> np.ndarray:
        """Stage s's devices, the stage axis kept (size 1)."""
        return np.take(self.mesh.devices, [s], axis=self.position)

    def _zero(self, device, shape, dtype) -> jax.Array:
        key = (device, tuple(shape), np.dtype(dtype))
        if key not in self._zeros:
            self._zeros[key] = jax.device_put(np.zeros(shape, dtype), device)
        return self._zeros[key]

    def _stack(self, x: jax.Array | None, sharding: NamedSharding, shape, dtype) -> jax.Array:
        """A global array of `shape` over `sharding` (stacked along dim 0) made of x's local
        shards where this process holds them and of zero blocks on its other devices."""
        mine = {}
        if x is not None:
            for shard in x.addressable_shards:
                mine[shard.device] = shard.data.reshape(1) if shard.data.ndim == 0 else shard.data
        index = sharding.addressable_devices_indices_map(shape)
        arrays = []
        for device in sharding.mesh.devices.flat:
            if device.process_index != self.me:
                continue
            if device in mine:
                arrays.append(mine[device])
            else:
                block = tuple(len(range(*sl.indices(n))) for sl, n in zip(index[device], shape))
                arrays.append(self._zero(device, block, dtype))
        return jax.make_array_from_single_device_arrays(shape, sharding, arrays)

    # -- stage a -> stage b ----------------------------------------------------------------

    def send(self, x: jax.Array | None, a: int, b: int, shape, dtype, spec: P) -> jax.Array | None:
        """Move `x` (sharded `spec` over stage a's devices; None where this process owns none
        of them) to stage b's devices with the same spec; None where this process owns none
        of stage b's devices. Every process calls it (one position in the program order)."""
        devices = np.concatenate(
            [self._stage_devices(a), self._stage_devices(b)], axis=self.position
        )
        if not owns(devices):
            self.inflight.skip()
            return None
        pair = Mesh(devices, self.mesh.axis_names)
        stacked = _stacked_spec(spec, len(shape), self.stage)
        sharding = NamedSharding(pair, stacked)
        big = (2 * shape[0], *shape[1:])
        # Registered whole: a process that only sends must wait for its sends too.
        out = self.inflight.add(
            _permute(pair, stacked, self.stage)(self._stack(x, sharding, big, dtype))
        )
        if lone(devices):  # a later gather could take every thread first (docs/cluster.md)
            self.inflight.settle(out)
        target = set(self._stage_devices(b).flat)
        got = [s.data for s in out.addressable_shards if s.device in target]
        if not got:
            return None
        stage_mesh = mesh_lib.index_along(self.mesh, self.stage, b)
        return jax.make_array_from_single_device_arrays(
            tuple(shape), NamedSharding(stage_mesh, spec), got
        )

    # -- stage s -> every device -----------------------------------------------------------

    def gather_tree(self, tree: Any, template: Any, s: int, specs: Any) -> Any:
        """Every leaf of `tree` (sharded by its spec in `specs` over stage s's devices; None
        where this process owns none of them) as an array over the whole mesh with the same
        spec, replicated over the stage axis. `template` gives shapes and dtypes (eval_shape output).
        One program for the whole tree: a psum over the stage axis of the stacked leaves, every
        other stage contributing zeros."""
        leaves, treedef = jax.tree.flatten(template)
        spec_leaves = tuple(treedef.flatten_up_to(specs))
        values = [None] * len(leaves) if tree is None else treedef.flatten_up_to(tree)
        k = self.mesh.shape[self.stage]
        stacked, ndims = [], []
        for x, t, spec in zip(values, leaves, spec_leaves, strict=True):
            shape = tuple(t.shape)
            big = (k * shape[0], *shape[1:]) if shape else (k,)
            sharding = NamedSharding(self.mesh, _stacked_spec(spec, len(shape), self.stage))
            stacked.append(self._stack(x, sharding, big, t.dtype))  # x's shards: block s
            ndims.append(len(shape))
        gather = _psum_stage(self.mesh, spec_leaves, tuple(ndims), self.stage)
        out = self.inflight.add(gather(stacked))
        return treedef.unflatten(out)


@functools.cache
def _permute(pair: Mesh, spec: P, stage: str):
    """The pair program: every block moves from the pair's stage 0 side to its stage 1 side."""
    return jax.jit(
        jax.shard_map(
            lambda v: lax.ppermute(v, stage, [(0, 1)]), mesh=pair, in_specs=spec, out_specs=spec
        )
    )


@functools.cache
def _psum_stage(mesh: Mesh, specs: tuple, ndims: tuple, stage: str):
    """The gather program for leaves with these specs and ranks."""

    def body(values):
        out = [lax.psum(v, stage) for v in values]
        return [v.reshape(()) if n == 0 else v for v, n in zip(out, ndims, strict=True)]

    in_specs = [_stacked_spec(p, n, stage) for p, n in zip(specs, ndims, strict=True)]
    out_specs = [p if n else P() for p, n in zip(specs, ndims, strict=True)]
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(in_specs,), out_specs=out_specs))
