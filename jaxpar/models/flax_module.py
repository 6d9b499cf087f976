"""A user's own `flax.linen.Module` as a SequentialModel, so every partitioning takes it.

The interface (README "Add a model"): a builder `fn(model_config, input_shape, num_classes)`
returns a module whose `__call__(x, train)` maps a batch of images to logits, keeping its
BatchNorm statistics in `batch_stats` and drawing its dropout from nn.Dropout. jaxpar wraps
it in its layer interface (`Wrapped`) and runs it unchanged:

- **Layers.** An `nn.Sequential`, or a module whose `__call__` runs the list attribute named by
  `model.layers` in order, becomes one layer per list entry (`layers_0`, `layers_1`, ... as
  flax names them), so a pipeline can cut between any two; any other module is one layer,
  named by its class, which a pipeline refuses to cut (`uncuttable`).
- **BatchNorm.** Every `nn.BatchNorm` averages its batch statistics over the run's batch axes
  in training (its `axis_name` is set where it runs), as one device's BatchNorm over the whole
  batch does.
- **Dropout.** Every `nn.Dropout` draws its mask per example, from a key folded from the
  example's id, its layer and its module path, so each row's mask is the same on any mesh
  (jaxpar's own layers do the same).
- **Logical names.** `nn.with_logical_constraint` on an activation takes the run's rules
  (a rules axis such as spatial splits what the module pins to "height"; the layer's
  `activation_names`). A parameter's dimensions are named by the module's own annotations
  (`nn.with_logical_partitioning`), else by the first of `model.param_rules` (regular
  expressions over its path, "Conv_0/kernel", searched) that matches; tensor.rules maps the
  names to mesh axes, and fsdp shards each parameter by its own rule (axes/fsdp.py) where no
  name says otherwise. BatchNorm's statistics take the names of their module's `scale`.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import zlib
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, AxisType
from jax.sharding import PartitionSpec as P

from jaxpar.errors import ConfigError
from jaxpar.models.base import Layer, SequentialModel, make_layer, statistics_names
from jaxpar.models.blocks import count_flops, equations
from jaxpar.models.layers import LOGICAL_AXES
from jaxpar.models.trace import traced

ParamRules = tuple[tuple[str, tuple], ...]


class Wrapped(nn.Module):
    """jaxpar's layer interface (models/layers.py ConvBlock's) around one module of a user's,
    sharing its scope: the variables are the module's own, under the layer's name."""

    inner: nn.Module  # the user's module, or a plain function of theirs as a _Function
    takes_train: bool = True
    out_axes: tuple = ()
    dtype: Any = jnp.float32
    bn_axis_name: Any = None
    dropout: bool = False

    def setup(self):
        if isinstance(self.inner, nn.Module):
            nn.share_scope(self, self.inner)

    def __call__(self, x, train: bool, keys=None):
        # nn.with_logical_constraint in the module resolves its names by the rules the run
        # sets around the step (SequentialModel.apply), on the step's mesh
        with nn.intercept_methods(_Interceptor(self.bn_axis_name if train else None, keys)):
            if self.takes_train:
                return self.inner(x, train=train)
            return self.inner(x)

    def flops(self, in_shape: tuple[int, ...]) -> int:
        return count_flops(self, in_shape)


@dataclasses.dataclass
class _Interceptor:
    """Runs a user's BatchNorm with the run's batch axes and its Dropout per example."""

    bn_axis_name: Any
    keys: Any

    def __call__(self, next_fun, args, kwargs, context):
        module = context.module
        if context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        if isinstance(module, nn.BatchNorm) and self.bn_axis_name is not None:
            # The module is the user's, created in their __call__ with its own axis_name
            # (None, as a single-device program has it): set for this call, then restored.
            saved = module.axis_name
            object.__setattr__(module, "axis_name", self.bn_axis_name)
            try:
                return next_fun(*args, **kwargs)
            finally:
                object.__setattr__(module, "axis_name", saved)
        if isinstance(module, nn.Dropout):
            return self._dropout(module, args, kwargs)
        return next_fun(*args, **kwargs)

    def _dropout(self, module, args, kwargs):
        x = args[0]
        deterministic = nn.merge_param(
            "deterministic", module.deterministic, kwargs.get("deterministic")
        )
        if deterministic or module.rate == 0.0:
            return x
        if self.keys is None:
            raise ValueError("dropout needs per-example keys: the batch lacks its 'example' ids")
        if 0 in tuple(module.broadcast_dims):
            raise ConfigError(
                f"nn.Dropout at {'/'.join(module.path)} shares its mask over the batch "
                "(broadcast_dims has 0), which no split of the batch can reproduce per "
                "example; broadcast over other dimensions only"
            )
        keep = 1.0 - module.rate
        shape = list(x.shape[1:])
        for d in module.broadcast_dims:
            shape[d - 1] = 1
        tag = zlib.crc32("/".join(module.path).encode())

        def mask(key):
            return jax.random.bernoulli(jax.random.fold_in(key, tag), keep, shape)

        masks = jax.vmap(mask)(self.keys)
        return jnp.where(masks, x / keep, jnp.zeros_like(x))


class _Function(nn.Module):
    """A plain function in a user's nn.Sequential (nn.relu, a reshape) as a module."""

    fn: Callable

    def __call__(self, x):
        return self.fn(x)


def _takes_train(module: Any) -> bool:
    call = type(module).__call__ if isinstance(module, nn.Module) else module
    try:
        return "train" in inspect.signature(call).parameters
    except (TypeError, ValueError):
        return False


def _pieces(module: nn.Module, attr: str) -> tuple[str, list] | None:
    """(attribute, entries) of a module a pipeline can cut, or None."""
    if attr:
        entries = getattr(module, attr, None)
        if not isinstance(entries, (list, tuple)) or not entries:
            raise ConfigError(
                f"model.layers={attr!r}: {type(module).__name__} has no non-empty list "
                f"attribute {attr!r} to run as a sequence of layers"
            )
        return attr, list(entries)
    if isinstance(module, nn.Sequential):
        return "layers", list(module.layers)
    return None


def from_module(
    module: nn.Module,
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    layers_attr: str = "",
    param_rules: ParamRules = (),
    dtype: Any = jnp.float32,
) -> SequentialModel:
    """A SequentialModel running `module` (see the module docstring); every refusal is one
    line, before anything is compiled."""
    pieces = _pieces(module, layers_attr)
    if pieces is None:
        if not _takes_train(module):
            raise ConfigError(
                f"model {name!r}: {type(module).__name__}.__call__ takes no `train` argument; "
                "jaxpar calls a module as module(x, train=True/False)"
            )
        units = [(type(module).__name__, module, True)]
        why = (
            f"model {name!r} is one flax module ({type(module).__name__}); a pipeline cuts "
            "between the entries of an nn.Sequential or of the list attribute named by "
            "model.layers, which its __call__ runs in order"
        )
    else:
        attr, entries = pieces
        units = []
        for i, entry in enumerate(entries):
            inner = entry if isinstance(entry, nn.Module) else _Function(entry)
            units.append((f"{attr}_{i}", inner, _takes_train(entry)))
        why = None
    rules = _compile_rules(param_rules)
    layers, shape = [], tuple(input_shape)
    for i, (unit_name, inner, takes_train) in enumerate(units):
        last = i == len(units) - 1
        probe = Wrapped(inner, takes_train, dtype=dtype)
        forward = traced(probe, shape)  # the variables and output: the wrapped module's too
        out_shape = forward.out_shape
        out_axes = ("batch", "classes") if last and len(out_shape) == 1 else ()
        wrapped = Wrapped(
            inner,
            takes_train,
            out_axes=out_axes or ("batch",) + (None,) * len(out_shape),
            dtype=dtype,
            dropout=_uses_dropout(probe, shape, forward.variables),
        )
        prefix = unit_name if pieces is not None else ""
        layer = _layer(unit_name, wrapped, shape, forward.variables, rules, prefix)
        pinned = _activation_names(probe, shape, forward.variables)
        layers.append(dataclasses.replace(layer, user_module=True, activation_names=pinned))
        shape = out_shape
    if shape != (num_classes,):
        raise ConfigError(
            f"model {name!r} returns logits of shape {shape} per example, not ({num_classes},) "
            f"for {num_classes} classes"
        )
    return SequentialModel(name, tuple(layers), tuple(input_shape), num_classes, uncuttable=why)


def _uses_dropout(module: Wrapped, in_shape: tuple[int, ...], boxed) -> bool:
    """Whether training `module` (its variables' shapes `boxed`) draws random numbers (an
    nn.Dropout), read from its program traced abstractly."""
    x = jax.ShapeDtypeStruct((2, *in_shape), jnp.float32)
    keys = jax.ShapeDtypeStruct((2,), jax.random.key(0).dtype)
    variables = nn.unbox(boxed)
    jaxpr = jax.make_jaxpr(
        lambda v, a, k: module.apply(v, a, train=True, keys=k, mutable=["batch_stats"])
    )(variables, x, keys)
    return any(e.primitive.name in _RANDOM for e in equations(jaxpr.jaxpr))


_RANDOM = ("random_bits", "threefry2x32", "random_wrap")


def _activation_names(module: Wrapped, in_shape: tuple[int, ...], boxed) -> tuple[str, ...]:
    """The names `module` (its variables' shapes `boxed`) pins its activations to with
    nn.with_logical_constraint, among jaxpar's logical names and its parameters' (read from
    its program, traced on a mesh of one device per name, each name its own axis)."""
    own = {n for spec in jax.tree.leaves(nn.get_partition_spec(boxed)) for n in spec if n}
    names = tuple(dict.fromkeys((*LOGICAL_AXES, *sorted(own))))
    mesh = AbstractMesh((1,) * len(names), names, axis_types=(AxisType.Auto,) * len(names))
    x = jax.ShapeDtypeStruct((1, *in_shape), jnp.float32)
    variables = nn.unbox(boxed)  # outside the mesh: unboxing would pin them to it
    with jax.sharding.use_abstract_mesh(mesh), nn.logical_axis_rules([(n, n) for n in names]):
        jaxpr = jax.make_jaxpr(lambda v, a: module.apply(v, a, train=False))(variables, x)
    found = {
        name
        for e in equations(jaxpr.jaxpr)
        if e.primitive.name == "sharding_constraint"
        for name in e.params["sharding"].spec
        if isinstance(name, str) and name != "batch"
    }
    return tuple(n for n in names if n in found)


def _compile_rules(rules: ParamRules) -> tuple[tuple[re.Pattern, tuple], ...]:
    out = []
    for rule in rules:
        if not (isinstance(rule, (tuple, list)) and len(rule) == 2):
            raise ConfigError(
                f"model.param_rules entries are (regular expression, logical names) pairs, got "
                f"{rule!r}; e.g. (('Conv_.*/kernel', (None, None, 'conv_in', 'conv_out')),)"
            )
        pattern, names = rule
        try:
            out.append((re.compile(pattern), tuple(names)))
        except re.error as e:
            raise ConfigError(f"model.param_rules: {pattern!r} is no regular expression ({e})")
    return tuple(out)


def _layer(name: str, module: Wrapped, in_shape, variables, rules, prefix: str) -> Layer:
    """make_layer's Layer, its parameters (`variables`: their shapes, boxed) left unnamed by
    the module's annotations named by `rules`, and its statistics by their scales' names."""
    layer = make_layer(name, module, in_shape)
    if not rules:
        return layer
    shapes = nn.unbox(variables.get("params", {}))

    def named(path, spec, shape):
        keys = [k.key for k in path]
        if spec != P() or not shape.shape:
            return spec
        text = "/".join([prefix, *keys] if prefix else keys)
        for pattern, names in rules:
            if pattern.search(text):
                if len(names) != len(shape.shape):
                    raise ConfigError(
                        f"model.param_rules: {pattern.pattern!r} names {len(names)} "
                        f"dimensions of {text}, which has {len(shape.shape)} {shape.shape}"
                    )
                return P(*names)
        return spec

    params = jax.tree_util.tree_map_with_path(
        named, layer.names["params"], shapes, is_leaf=lambda x: isinstance(x, P)
    )
    names = {"params": params, "batch_stats": statistics_names(params, variables)}
    return dataclasses.replace(layer, names=names)
