"""Tensor (channel) partitioning as sharding rules: logical axis names -> mesh axes.

Every variable and activation of a layer carries logical axis names (models/layers.py:
conv kernels (None, None, "conv_in", "conv_out"), BatchNorm ("conv_out",), dense kernels
(in, out) with "embed", "mlp", "hidden", "classes"). Variables get them through flax's logical
partitioning (`nn.with_logical_partitioning` on their initialisers, read back with
`nn.get_partition_spec` when a Layer is built), and `nn.logical_to_mesh_axes` maps names to
mesh axes. Two parts stay ours, for reasons flax leaves open: BatchNorm's running statistics
are created without an initialiser to box, so they take their module's `scale` names
(models/base.py: `logical_names`); and activations are pinned with `with_sharding_constraint`
on the abstract mesh of the enclosing shard_map, which `nn.with_logical_constraint` (global
mesh and rules context) does not see. `config.tensor.rules` maps names to mesh
axes, e.g. (("conv_out", "tensor"), ("mlp", "tensor")): conv kernels split by output channels
(each device computes c_out / t channels; BatchNorm statistics of a channel stay with its
shard), the first hidden dense layer column-wise and the next row-wise (Megatron).

The rules are applied inside the step (manual over the batch axes, automatic over the rules
axes such as "tensor"): XLA's
SPMD partitioner then inserts the collectives at layer boundaries (an all-gather of the
channels before a conv that needs them all, a reduce of the partial sums after a row-parallel
layer). `--explain` reads them from the compiled program. Channel counts that do not divide by
the tensor size are refused with a one-line error.
"""

from __future__ import annotations

import flax.linen as nn
import jax
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar import axes
from jaxpar import config as config_lib
from jaxpar.errors import ConfigError
from jaxpar.mesh import is_spec
from jaxpar.models import SequentialModel
from jaxpar.models.layers import LOGICAL_AXES
from jaxpar.models.trace import traced

Rules = tuple[tuple[str, str | None], ...]


def rules_from(config) -> Rules:
    """The config's rules as a tuple of (logical name, mesh axis or None) pairs."""
    return tuple((str(name), axis) for name, axis in config.tensor.rules)


def check_rules(rules, mesh_axes: tuple[str, ...] = (), own_names: bool = False) -> None:
    """Sharding rules name known logical axes and registered rules axes (or None). An axis
    the run's mesh (`mesh_axes`) lacks splits nothing; that is allowed (the default rules
    name tensor, and a mesh without it simply keeps channels whole). `own_names`: a user's
    model may annotate names of its own (checked against the model by `names_problem`)."""
    for rule in rules:
        config_lib.check(
            isinstance(rule, tuple) and len(rule) == 2,
            f"tensor.rules entries are (logical name, mesh axis) pairs, got {rule!r}; "
            'e.g. --config.tensor.rules=\'(("conv_out","tensor"),)\'',
        )
        name, axis = rule
        config_lib.check(
            own_names or name in LOGICAL_AXES,
            f"tensor.rules names {name!r}, which no layer uses; choose from "
            f"{', '.join(LOGICAL_AXES)}",
        )
        ruled = [a for a in axes.names() if axes.get(a).role == "rules"]
        config_lib.check(
            axis is None or axis in ruled,
            f"tensor.rules maps {name!r} to mesh axis {axis!r}, which is not a rules axis; "
            f"use {', '.join(ruled)} or None",
        )


def spec(names: tuple, rules: Rules) -> P:
    """PartitionSpec of an array whose dimensions have these logical names (flax's mapping;
    names without a rule stay unsplit)."""
    return nn.logical_to_mesh_axes(names, rules)


def layer_specs(layer, rules: Rules) -> dict:
    """{"params": ..., "batch_stats": ...} of PartitionSpecs over mesh axes for one layer's
    variables: its logical names (flax's logical partitioning, models/base.py) mapped by the
    rules."""
    return {
        coll: jax.tree.map(lambda names: spec(tuple(names), rules), tree, is_leaf=is_spec)
        for coll, tree in layer.names.items()
    }


def variable_specs(model: SequentialModel, rules: Rules, layers: slice = slice(None)) -> dict:
    """{"params": {...}, "batch_stats": {...}} of PartitionSpecs for `layers`' variables."""
    out: dict[str, dict] = {"params": {}, "batch_stats": {}}
    for layer in model.layers[layers]:
        specs = layer_specs(layer, rules)
        # Like model.init: every layer has a params entry, empty for a layer without
        # parameters (a pool); batch statistics only where the layer keeps some.
        out["params"][layer.name] = specs.get("params", {})
        if specs.get("batch_stats"):
            out["batch_stats"][layer.name] = specs["batch_stats"]
    return out


def constrain_tree(tree, specs):
    """Pin every array of `tree` (inside shard_map) to its spec over the automatic axes (the
    manual ones, e.g. fsdp's split of a parameter, are shard_map's already)."""
    mesh = jax.sharding.get_abstract_mesh()
    auto = {a for a, t in zip(mesh.axis_names, mesh.axis_types) if t == AxisType.Auto}

    def only_auto(s: P) -> P:
        return P(*[p if p in auto else None for p in s])

    return jax.tree.map(
        lambda s, x: lax.with_sharding_constraint(x, NamedSharding(mesh, only_auto(s))),
        specs,
        tree,
        is_leaf=is_spec,
    )


class Constrain:
    """`constrain(x, logical_axes, layer=None)` for model.apply: pins an activation's sharding
    over the automatic mesh axes inside shard_map. The batch dimension is left alone (it is
    split by the manual batch axes already). `joins`: {mesh axis: names of layers whose
    outputs it leaves whole} (variables.joins): there the names it splits stay unsplit.
    `rules` also resolve a layer's own nn.with_logical_constraint (models/base.py)."""

    def __init__(self, rules: Rules, joins: dict | None = None):
        self.rules = rules
        self.joins = joins or {}
        self._per_layer: dict = {}

    def _rules_at(self, layer) -> Rules:
        if layer not in self._per_layer:
            whole = {a for a, names in self.joins.items() if layer in names}
            self._per_layer[layer] = tuple((n, None if a in whole else a) for n, a in self.rules)
        return self._per_layer[layer]

    def __call__(self, x, names, layer=None):
        names = tuple(None if n == "batch" else n for n in names)
        mesh = jax.sharding.get_abstract_mesh()
        layout = spec(names, self._rules_at(layer) if self.joins else self.rules)
        return lax.with_sharding_constraint(x, NamedSharding(mesh, layout))


def problem(model: SequentialModel, rules: Rules, mesh_shape: dict[str, int]) -> str | None:
    """Why the rules cannot split `model` on this mesh (a dimension that does not divide by
    its axis' size; one line), or None. Remembered per model, rules and sizes: the planner
    asks for thousands of candidates."""
    sizes = tuple(sorted((a, n) for a, n in mesh_shape.items() if n > 1))
    key = (id(model), model.name, tuple(rules), sizes)
    if key not in _PROBLEMS:
        try:
            check(model, rules, mesh_shape)
            _PROBLEMS[key] = None
        except ConfigError as e:
            _PROBLEMS[key] = str(e)
    return _PROBLEMS[key]


_PROBLEMS: dict = {}


def check(model: SequentialModel, rules: Rules, mesh_shape: dict[str, int]) -> None:
    """Refuse a split whose dimension does not divide by its mesh axis size (one line)."""
    for layer in model.layers:
        variables = traced(layer.module, layer.in_shape).variables
        for coll, tree in layer_specs(layer, rules).items():
            shapes = nn.unbox(variables.get(coll, {}))
            named = jax.tree_util.tree_leaves_with_path(tree, is_leaf=is_spec)
            for (path, split), leaf in zip(named, jax.tree.leaves(shapes), strict=True):
                keys = [k.key for k in path]
                for dim, axis in zip(leaf.shape, split):
                    size = mesh_shape.get(axis, 1) if isinstance(axis, str) else 1
                    if dim % size:
                        raise ConfigError(
                            f"{layer.name}/{'/'.join(keys)} has {dim} along the dimension split "
                            f"over '{axis}' ({size} devices), which does not divide; choose "
                            f"model.width so channel counts are multiples of {size}, or a "
                            f"smaller tensor axis"
                        )
