"""How a run lays its model's variables out over the mesh, and gathers them where a layer runs.

Two kinds of axes split variables (jaxpar/axes/):

- rules axes (tensor): the sharding rules map each variable's logical dimension names to
  them (parallel/tensor.py); rules naming an axis the run lacks, or has at size 1, split
  nothing;
- parameter-sharding batch axes (fsdp): each picks one more dimension of every parameter
  leaf (`Axis.param_dim`), among those the rules left whole. Batch statistics stay whole.

`specs` is the one place these combine: the strategies and the pipeline's chunks build their
sync rules from it, so every layout, the canonical state and the analysis follow it.
`gather_fn` is what a step gives `model.apply` to run a layer from its parameters' shards.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxpar import axes
from jaxpar.mesh import is_spec
from jaxpar.models import SequentialModel
from jaxpar.parallel import tensor


def rules_on(rules: tensor.Rules, shape: dict[str, int]) -> tensor.Rules:
    """The rules that split something on this mesh: those naming one of its rules axes of
    size > 1 (the others map their names to None: unsplit), then each such axis' own rules
    (`Axis.rules`, e.g. ("height", "spatial")) for names the config maps nowhere present."""
    present = set(axes.auto_axes(shape))
    out = [(name, axis if axis in present else None) for name, axis in rules]
    mapped = {name for name, axis in out if axis is not None}
    own = [
        (name, a)
        for a in axes.auto_axes(shape)
        for name, _ in axes.get(a).rules
        if name not in mapped
    ]
    ruled = {name for name, _ in own}
    return tuple(r for r in out if r[0] not in ruled) + tuple(own)


def joins(shape: dict[str, int], model: SequentialModel) -> dict[str, frozenset]:
    """{rules axis: names of the layers whose outputs it leaves whole} on this mesh."""
    return {a: axes.get(a).joins(shape, model) for a in axes.auto_axes(shape)}


def specs(
    model: SequentialModel, rules: tensor.Rules, shape: dict[str, int], layers: slice = slice(None)
) -> dict:
    """{"params": {...}, "batch_stats": {...}} PartitionSpecs of `layers`' variables over the
    mesh `shape` ({axis: size})."""
    out = jax.tree.map(
        _trim, tensor.variable_specs(model, rules_on(rules, shape), layers), is_leaf=is_spec
    )
    sharding = axes.sharding_axes(shape)
    if not sharding:
        return out
    shapes = model.variable_shapes(layers)["params"]
    for layer in model.layers[layers]:
        names = layer.names.get("params", {})
        out["params"][layer.name] = jax.tree.map(
            lambda spec, leaf, logical: _shard(spec, leaf.shape, tuple(logical), sharding, shape),
            out["params"][layer.name],
            shapes[layer.name],
            names,
            is_leaf=is_spec,
        )
    return out


def _trim(spec: P) -> P:
    """The same split without trailing unsplit dimensions: P(None, None, "tensor") stays,
    P(None, None) is P()."""
    parts = list(spec)
    while parts and parts[-1] is None:
        parts.pop()
    return P(*parts)


def _shard(spec: P, shape: tuple, names: tuple, sharding, sizes) -> P:
    parts = list(spec) + [None] * (len(shape) - len(spec))
    for name in sharding:
        dim = axes.get(name).param_dim(
            shape, names, tuple(p is not None for p in parts), sizes[name]
        )
        if dim is not None:
            parts[dim] = name
    while parts and parts[-1] is None:
        parts.pop()
    return P(*parts)


class Split(tuple):
    """A leaf's (axis, dimension) pairs of parameter-sharding axes (a pytree leaf)."""


jax.tree_util.register_pytree_node(Split, lambda s: ((), tuple(s)), lambda aux, _: Split(aux))


def sharded_leaves(param_specs: dict, shape: dict[str, int]) -> dict:
    """Per parameter leaf, the (axis, dimension) pairs of parameter-sharding axes it is split
    along (empty for a whole leaf)."""
    sharding = set(axes.sharding_axes(shape))
    return jax.tree.map(
        lambda s: Split((p, d) for d, p in enumerate(s) if p in sharding),
        param_specs,
        is_leaf=is_spec,
    )


def gather_fn(param_specs: dict, shape: dict[str, int]) -> Gathered | None:
    """What a step gives model.apply (`gathered`) to run each layer from its parameters'
    shards, or None when the mesh shards no parameters."""
    where = sharded_leaves(param_specs, shape)
    if not any(jax.tree.leaves(where, is_leaf=_is_split)):
        return None
    return Gathered(where)


def _is_split(x) -> bool:
    return isinstance(x, Split)


class Gathered:
    """Layers run from parameter shards (fsdp): `wrap(layer_name, run)` turns
    `run(params, stats, x, keys) -> (y, new_stats)` into the same function of the layer's
    shards.

    Forward: the shards are all-gathered (`Axis.gather`), the layer runs, and what its
    backward needs is kept except the gathered parameters. Backward: the shards are gathered
    again, the layer's pullback runs, and the parameters' gradients are reduce-scattered back
    to shards (the all-gather's transpose: a sum over the axis). The second gather takes its
    shards through a zero that depends on the output gradient, so that no compiler can merge
    it with the forward's (XLA:CPU removes optimisation barriers before common-subexpression
    elimination, which merged the two gathers of a plain `jax.checkpoint` and kept every
    layer's gathered parameters alive from forward to backward).

    `probed(probe)` (the gradient noise scale, noise_scale.py): the same, with each wrapped
    layer also taking `probe`, a zero scalar varying over the replica axes, whose cotangent
    its backward sets to the squared norm of the layer's sharded leaves' gradient as this
    device computed it, before the reduce-scatter sums it over the replicas: so d loss /
    d probe is the replica's own gradient's squared norm over every sharded leaf, which no
    other way sees; `whole` gives the leaves it leaves out, whose gradients stay local."""

    def __init__(self, where: dict, probe=None):
        self.where, self.probe = where, probe

    def probed(self, probe) -> Gathered:
        return Gathered(self.where, probe)

    def whole(self, grads) -> list:
        """The leaves of a params-shaped tree that no parameter-sharding axis splits."""
        out = []
        jax.tree.map(
            lambda pairs, g: None if pairs else out.append(g), self.where, grads, is_leaf=_is_split
        )
        return out

    def wrap(self, name: str, run):
        where = self.where.get(name, {})
        if not any(jax.tree.leaves(where, is_leaf=_is_split)):
            return run
        layer, probe = _gathered_layer(run, where), self.probe
        return lambda shards, stats, x, keys: layer(shards, stats, x, keys, probe)


def _gather(shards, where):
    return jax.tree.map(lambda pairs, x: _gather_leaf(x, pairs), where, shards, is_leaf=_is_split)


def _gather_leaf(x, pairs):
    for axis, dim in pairs:
        x = axes.get(axis).gather(x, dim)
    return x


def _scatter(grads, where):
    """The gathers' transpose: each leaf's gradient summed over its axes, this device keeping
    its shard (a reduce-scatter per axis, in reverse order)."""

    def one(pairs, g):
        for axis, dim in reversed(pairs):
            g = lax.psum_scatter(g, axis, scatter_dimension=dim, tiled=True)
        return g

    return jax.tree.map(one, where, grads, is_leaf=_is_split)


def _gathered_layer(run, where):
    static: dict = {}  # the pullback's structure, from the forward's trace to the backward's

    @jax.custom_vjp
    def layer(shards, stats, x, keys, probe):
        return run(_gather(shards, where), stats, x, keys)

    def fwd(shards, stats, x, keys, probe):
        full = _gather(shards, where)
        out, pullback = jax.vjp(lambda p, x: run(p, stats, x, keys), full, x)
        leaves, static["tree"] = jax.tree.flatten(pullback)
        position = {id(leaf): i for i, leaf in enumerate(jax.tree.leaves(full))}
        static["kinds"] = [position.get(id(leaf)) for leaf in leaves]
        kept = [leaf for leaf, kind in zip(leaves, static["kinds"]) if kind is None]
        return out, (shards, stats, kept, probe)

    def bwd(residuals, cotangent):
        shards, stats, kept, probe = residuals
        zero = jnp.ravel(jax.tree.leaves(cotangent)[0])[0] * 0  # ties the gather to the backward
        again = jax.tree.leaves(
            _gather(jax.tree.map(lambda s: s + zero.astype(s.dtype), shards), where)
        )
        stored = iter(kept)
        leaves = [next(stored) if k is None else again[k] for k in static["kinds"]]
        grads, dx = jax.tree.unflatten(static["tree"], leaves)(cotangent)
        no_stats = jax.tree.map(jnp.zeros_like, stats)
        sq = None
        if probe is not None:  # this device's gradient of the sharded leaves, squared
            split = []
            jax.tree.map(
                lambda pairs, g: split.append(g) if pairs else None, where, grads, is_leaf=_is_split
            )
            sq = sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in split)
            sq = sq.astype(probe.dtype)
        return _scatter(grads, where), no_stats, dx, None, sq

    layer.defvjp(fwd, bwd)
    return layer


def names_problem(model: SequentialModel, rules: tensor.Rules, shape: dict[str, int]) -> str | None:
    """Why a user's flax module cannot be split by names on this mesh (one line), or None: a
    parameter annotated with a name that is neither jaxpar's (LOGICAL_AXES) nor mapped by a
    rule, or a rules axis of size > 1 that none of its parameters' or pinned activations'
    names map to (it would split nothing). jaxpar's own layers always name what their axes
    split."""
    if not any(layer.user_module for layer in model.layers):
        return None
    used = names_used(model)
    for layer in model.layers:
        for name in layer.activation_names:
            used.setdefault(name, f"an activation of {layer.name}")
    mapped = {name for name, _ in rules}
    for name, where in used.items():
        if name not in tensor.LOGICAL_AXES and name not in mapped:
            return (
                f"{where} is annotated {name!r}, which no tensor.rules entry maps; add "
                f"({name!r}, 'tensor') to split it or ({name!r}, None) to keep it whole"
            )
    on = rules_on(rules, shape)
    for axis in axes.auto_axes(shape):
        names = [n for n, a in on if a == axis and n in used]
        if not names:
            wanted = sorted({n for n, a in on if a == axis})
            return (
                f"mesh axis {axis!r} ({shape[axis]} devices) would split nothing of model "
                f"{model.name}: none of its parameters or pinned activations carries a name "
                "mapped to it "
                f"({', '.join(wanted) or 'none'}); annotate the module "
                "(nn.with_logical_partitioning) or name its parameters with model.param_rules"
            )
    return None


def names_used(model: SequentialModel) -> dict[str, str]:
    """{logical name: the first parameter path that carries it} over the model's layers."""
    used: dict[str, str] = {}
    for layer in model.layers:
        named = jax.tree_util.tree_leaves_with_path(layer.names.get("params", {}), is_leaf=is_spec)
        for path, split in named:
            for name in split:
                if isinstance(name, str):
                    used.setdefault(name, "/".join([layer.name, *[k.key for k in path]]))
    return used
