"""Tensor (channel) partitioning as sharding rules: logical axis names -> mesh axes.

Every variable and activation of a layer carries logical axis names (models/layers.py:
conv kernels (None, None, "conv_in", "conv_out"), BatchNorm ("conv_out",), dense kernels
(in, out) with "embed", "mlp", "hidden", "classes"). `config.tensor.rules` maps names to mesh
axes, e.g. (("conv_out", "tensor"), ("mlp", "tensor")): conv kernels split by output channels
(each device computes c_out / t channels; BatchNorm statistics of a channel stay with its
shard), the first hidden dense layer column-wise and the next row-wise (Megatron).

The rules are applied inside the step (manual over "data", automatic over "tensor"): XLA's
SPMD partitioner then inserts the collectives at layer boundaries (an all-gather of the
channels before a conv that needs them all, a reduce of the partial sums after a row-parallel
layer). `--explain` reads them from the compiled program. Channel counts that do not divide by
the tensor size are refused with a one-line error.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar import config as config_lib
from jaxpar.errors import ConfigError
from jaxpar.mesh import AXES
from jaxpar.models import SequentialModel
from jaxpar.models.layers import LOGICAL_AXES

Rules = tuple[tuple[str, str | None], ...]


def rules_from(config) -> Rules:
    """The config's rules as a tuple of (logical name, mesh axis or None) pairs."""
    return tuple((str(name), axis) for name, axis in config.tensor.rules)


def check_rules(rules) -> None:
    """Sharding rules name known logical axes and existing mesh axes (or None)."""
    for rule in rules:
        config_lib.check(
            isinstance(rule, tuple) and len(rule) == 2,
            f"tensor.rules entries are (logical name, mesh axis) pairs, got {rule!r}; "
            'e.g. --config.tensor.rules=\'(("conv_out","tensor"),)\'',
        )
        name, axis = rule
        config_lib.check(
            name in LOGICAL_AXES,
            f"tensor.rules names {name!r}, which no layer uses; choose from "
            f"{', '.join(LOGICAL_AXES)}",
        )
        config_lib.check(
            axis is None or axis in AXES,
            f"tensor.rules maps {name!r} to mesh axis {axis!r}, which does not exist; use "
            f"{', '.join(AXES)} or None",
        )


def spec(names: tuple, rules: Rules) -> P:
    """PartitionSpec of an array whose dimensions have these logical names (flax's mapping;
    names without a rule stay unsplit)."""
    return nn.logical_to_mesh_axes(names, rules)


def variable_specs(model: SequentialModel, rules: Rules, layers: slice = slice(None)) -> dict:
    """{"params": {...}, "batch_stats": {...}} of PartitionSpecs for `layers`' variables."""
    out: dict[str, dict] = {"params": {}, "batch_stats": {}}
    for layer in model.layers[layers]:
        axes = layer.module.logical_axes()
        params, stats = {}, {}
        for sub, leaves in axes.items():
            for leaf, names in leaves.items():
                target = stats if leaf in ("mean", "var") else params
                target.setdefault(sub, {})[leaf] = spec(names, rules)
        out["params"][layer.name] = params
        if stats:
            out["batch_stats"][layer.name] = stats
    return out


def state_specs(state_shapes, model: SequentialModel, rules: Rules, layers=slice(None)):
    """PartitionSpecs for a TrainState: variables by the rules, optimizer state like params."""
    specs = variable_specs(model, rules, layers)
    return state_shapes.replace(
        step=P(),
        params=specs["params"],
        batch_stats=specs["batch_stats"],
        opt_state=like_params(state_shapes.opt_state, specs["params"]),
    )


def constrain_tree(tree, specs):
    """Pin every array of `tree` (inside shard_map) to its spec over the automatic axes."""
    mesh = jax.sharding.get_abstract_mesh()
    return jax.tree.map(
        lambda s, x: lax.with_sharding_constraint(x, NamedSharding(mesh, s)),
        specs,
        tree,
        is_leaf=lambda x: isinstance(x, P),
    )


def like_params(tree_shapes: Any, params_specs: Any) -> Any:
    """Specs for an optimizer state: each subtree shaped like the params takes their specs;
    anything else (step counts) is replicated."""
    treedef = jax.tree.structure(params_specs, is_leaf=lambda x: isinstance(x, P))

    def is_params(x) -> bool:
        try:
            return jax.tree.structure(x) == treedef
        except Exception:  # noqa: BLE001 - non-pytree leaves are simply not params-shaped
            return False

    return jax.tree.map(
        lambda x: params_specs if is_params(x) else P(), tree_shapes, is_leaf=is_params
    )


def constrain_fn(rules: Rules):
    """`constrain(x, logical_axes)` for model.apply: pins an activation's sharding over the
    automatic mesh axes inside shard_map. The batch dimension is left alone (it is split by
    the manual "data" axis already)."""

    def constrain(x, names):
        names = tuple(None if n == "batch" else n for n in names)
        mesh = jax.sharding.get_abstract_mesh()
        return lax.with_sharding_constraint(x, NamedSharding(mesh, spec(names, rules)))

    return constrain


def check(model: SequentialModel, rules: Rules, mesh_shape: dict[str, int]) -> None:
    """Refuse a split whose dimension does not divide by its mesh axis size (one line)."""
    for layer in model.layers:
        variables = jax.eval_shape(
            lambda layer=layer: layer.module.init(
                jax.random.key(0), jax.numpy.zeros((1, *layer.in_shape)), train=False
            )
        )
        for sub, leaves in layer.module.logical_axes().items():
            for leaf, names in leaves.items():
                coll = "batch_stats" if leaf in ("mean", "var") else "params"
                shape = variables[coll][sub][leaf].shape
                for dim, axis in zip(shape, spec(names, rules)):
                    size = mesh_shape.get(axis, 1) if isinstance(axis, str) else 1
                    if dim % size:
                        raise ConfigError(
                            f"{layer.name}/{sub}/{leaf} has {dim} along the dimension split "
                            f"over '{axis}' ({size} devices), which does not divide; choose "
                            f"model.width so channel counts are multiples of {size}, or a "
                            f"smaller tensor axis"
                        )
