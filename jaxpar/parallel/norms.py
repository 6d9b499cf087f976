"""Squared gradient norms inside a step body: what the gradient noise scale is measured from
(jaxpar/noise_scale.py).

A step reports two scalars, each the squared L2 norm of a whole model's gradient: the mean over
its equal small groups (replicas, accumulation slices, micro-batches) of each group's gradient,
and the combined gradient the update applies. Nothing but these scalars crosses devices: each
device sums the squares of its own pieces, and a scalar psum adds the pieces a leaf is split
into over manual (shard_map) axes; over axes left to the sharding rules (tensor, spatial) the
leaves are whole arrays to the program and XLA adds the pieces itself.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxpar.mesh import is_spec
from jaxpar.run_spec import SyncSpec

# The most leaves one GPU reduction reads: XLA:GPU fuses a concatenation into the reduction
# that reads it up to 96 operands and outputs per fusion, past which it writes the
# concatenation to memory whole (a float32 copy of the gradient): this stays below that limit.
# `python benchmarks/gpu_programs.py --rows resnet50:224:float32:128:h100_sxm:8` prints the
# step's kernels and temporary memory, where a copy would show.
LEAVES_PER_REDUCTION = 80


def local_sq(tree: Any) -> jax.Array:
    """The sum of squares of every leaf of `tree` as this device sees it (float32).

    On a GPU the leaves are flattened and concatenated, LEAVES_PER_REDUCTION at a time, into
    one reduction each, which reads the concatenation inside its kernel (nothing is copied):
    a few kernels where a reduction per leaf took one or two, at about the same temporary
    memory (benchmarks/gpu_programs.py counts both for a data-parallel step on H100s).
    Elsewhere a reduction per leaf: XLA:CPU writes a concatenation out whole (a float32 copy
    of the gradient, which costs more than the reductions)."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return jnp.zeros((), jnp.float32)
    return lax.platform_dependent(
        leaves, cuda=sq_concatenated, rocm=sq_concatenated, default=sq_per_leaf
    )


def sq_per_leaf(leaves: list) -> jax.Array:
    """local_sq's form off GPUs: a reduction per leaf."""
    return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves)


def _flat(x: jax.Array) -> jax.Array:
    """`x` as a float32 vector, a convolution kernel's gradient [H, W, I, O] in the order
    cuDNN writes it on an H100 in float32 ([O, H, W, I]): read where it lies. Flattened as
    [H, W, I, O] XLA:GPU writes a transposed copy first, a kernel per convolution
    (benchmarks/gpu_programs.py counts them). Where it lies otherwise (an A100 in float32) the copy is written
    in either order; where it is converted first (bfloat16), in neither."""
    if x.ndim == 4:
        x = jnp.moveaxis(x, 3, 0)
    return jnp.ravel(x).astype(jnp.float32)


def sq_concatenated(leaves: list) -> jax.Array:
    """local_sq's form on GPUs: LEAVES_PER_REDUCTION leaves concatenated a reduction."""
    groups = -(-len(leaves) // LEAVES_PER_REDUCTION)
    size = -(-len(leaves) // groups)
    return sum(
        jnp.sum(jnp.square(jnp.concatenate([_flat(x) for x in leaves[i : i + size]])))
        for i in range(0, len(leaves), size)
    )


def _split_over(spec: P, manual: tuple[str, ...]) -> tuple[str, ...]:
    named = {a for part in spec if part for a in (part if isinstance(part, tuple) else (part,))}
    return tuple(a for a in manual if a in named)


def sq_norm(tree: Any, specs: Any, manual: tuple[str, ...]) -> jax.Array:
    """The squared norm of the whole of `tree` inside shard_map over the `manual` axes, where
    leaf i is split as `specs` says: the leaves split over some manual axes are summed over
    those (one scalar psum per distinct group), the others are whole on every device."""
    leaves, treedef = jax.tree.flatten(tree)
    if specs is None:
        return local_sq(leaves)
    spec_leaves = treedef.flatten_up_to(specs) if not is_spec(specs) else [specs] * len(leaves)
    groups: dict[tuple[str, ...], list] = {}
    for x, spec in zip(leaves, spec_leaves, strict=True):
        groups.setdefault(_split_over(spec, manual), []).append(x)
    total = jnp.zeros((), jnp.float32)
    for over, xs in groups.items():
        part = local_sq(xs)
        total = total + (lax.psum(part, over) if over else part)
    return total


def why_not_measured(
    measure: bool, sync: SyncSpec, model, combines: bool, replicas: int
) -> str | None:
    """Why a step (`measure`: measure_noise_scale, `sync`: its sync settings) cannot measure the noise scale whatever its groups, in one line,
    or None: measuring is off; the sync rule forms no combined gradient (combines=False); or
    BatchNorm normalises over the global batch, so that a replica's gradient is not the
    gradient of its own images (the statistics couple the replicas: an estimate from them is
    biased, |G_small|^2 above what any noise allows, seen on VGG11 over 8 replicas)."""
    if not measure:
        return "measure_noise_scale=False"
    if not combines:
        return (
            f"sync.mode={sync.mode} forms no combined gradient of the step's replicas; "
            "measure the noise scale under sync.mode=allreduce (the same model and batch)"
        )
    has_bn = any(layer.names.get("batch_stats") for layer in model.layers)
    if has_bn and replicas > 1 and sync.batch_norm == "global":
        return (
            "BatchNorm over the global batch couples the replicas' gradients, so an estimate "
            "from them would be biased; use --config.sync.batch_norm=local (each replica "
            "normalises its own images) or a model without BatchNorm"
        )
    return None
