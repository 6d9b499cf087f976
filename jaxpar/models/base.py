"""A model as an ordered sequence of layers that a partitioner can cut between any two.

Each `Layer` carries a flax module plus its static costs (parameters, forward FLOPs and output
activation size per example), so pipeline and tensor partitioners can balance and report
without tracing. Variables are stored per layer: {"params": {layer_name: ...},
"batch_stats": {layer_name: ...}}; that canonical form is what checkpoints and stage splits use.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxpar.models.trace import traced


@dataclasses.dataclass(frozen=True)
class Layer:
    """One cuttable unit: a flax module and its per-example costs."""

    name: str
    module: nn.Module
    in_shape: tuple[int, ...]  # per example, e.g. (32, 32, 3)
    out_shape: tuple[int, ...]
    params: int  # trainable parameter count
    flops: int  # forward FLOPs per example (2 x multiply-adds of convs and matmuls)
    # {"params": ..., "batch_stats": ...} like the layer's variables, with a PartitionSpec of
    # logical dimension names per leaf (flax's logical partitioning; see `logical_names`).
    names: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # A user's flax module (models/flax_module.py): its logical names come from its own
    # annotations, and it pins its activations to `activation_names` itself (with
    # nn.with_logical_constraint) where jaxpar's layers are pinned by `constrain` alone.
    user_module: bool = dataclasses.field(default=False, compare=False, repr=False)
    activation_names: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False)

    @property
    def activation_size(self) -> int:
        """Elements of this layer's output per example (what a pipeline stage sends on)."""
        return math.prod(self.out_shape)


@dataclasses.dataclass(frozen=True)
class SequentialModel:
    """An ordered tuple of layers from an input shape to `num_classes` logits."""

    name: str
    layers: tuple[Layer, ...]
    input_shape: tuple[int, ...]
    num_classes: int
    # Measured per-layer times (pipeline/balance.py LayerTimes) where a run profiled them for
    # pipeline.split="time"; None otherwise.
    times: Any = dataclasses.field(default=None, compare=False, repr=False)
    # Why a pipeline cannot cut this model (one line: a user's flax module that is not a
    # sequence, models/flax_module.py); None where it can cut between any two layers.
    uncuttable: str | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def num_params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def stochastic(self) -> bool:
        """Whether training draws random masks (dropout): batches then carry example ids."""
        return any(layer.module.dropout for layer in self.layers)

    @property
    def flops_per_example(self) -> int:
        """Forward FLOPs per example; a training step costs about 3x this."""
        return sum(layer.flops for layer in self.layers)

    def init(self, rng: jax.Array, layers: slice = slice(None)) -> dict[str, dict[str, Any]]:
        """Initialise `layers` (default: all), each from its own key folded from its index,
        so a pipeline stage that initialises only its layers gets the same values."""

        def draw(i, layer):
            x = jnp.zeros((1, *layer.in_shape), jnp.float32)
            return layer.module.init(jax.random.fold_in(rng, i), x, train=False)

        return self._variables(draw, layers)

    def variable_shapes(self, layers: slice = slice(None)) -> dict[str, dict[str, Any]]:
        """What `init` returns, as shapes and dtypes, read from each layer's traced program
        (models/trace.py: nothing is traced again for a layer traced before)."""
        return self._variables(
            lambda i, layer: traced(layer.module, layer.in_shape).variables, layers
        )

    def _variables(self, per_layer, layers: slice) -> dict[str, dict[str, Any]]:
        """{"params": {name: ...}, "batch_stats": {name: ...}} of `layers`, each layer's
        boxed variables from per_layer(index, layer)."""
        variables: dict[str, dict[str, Any]] = {"params": {}, "batch_stats": {}}
        for i in range(len(self.layers))[layers]:
            layer = self.layers[i]
            v = nn.unbox(per_layer(i, layer))
            variables["params"][layer.name] = v.get("params", {})
            if "batch_stats" in v:
                variables["batch_stats"][layer.name] = v["batch_stats"]
        return variables

    def apply(
        self,
        params: dict[str, Any],
        batch_stats: dict[str, Any],
        x: jax.Array,
        *,
        train: bool,
        bn_axis_name: str | tuple[str, ...] | None = None,
        layers: slice = slice(None),
        constrain: Any = None,
        example: jax.Array | None = None,
        gather: Any = None,
    ) -> tuple[jax.Array, dict[str, Any]]:
        """Run `layers` (default: all) on x; return output and updated batch statistics.

        `bn_axis_name`: mesh axis (or axes) over which BatchNorm averages its batch statistics
        (synchronised BatchNorm inside shard_map/pmap); None uses the local batch only.
        `constrain` (parallel/tensor.py Constrain), called as `constrain(x, logical_axes,
        layer_name=None)`: applied to every layer's output (and to
        the input of a flatten) to pin activation shardings under the rules axes (tensor,
        spatial); None does nothing.
        `example`: per-row ids of the batch (uint32, see data.Dataset.train_batch), from which
        dropout layers draw their masks in training: layer i's key for a row is
        fold_in(key(i), id), the same on any device.
        `gather`: runs layers from this device's parameter shards (fsdp): `gather.wrap(name,
        run)` turns a layer's run(params, stats, x, keys) into the same function of its
        shards (jaxpar/parallel/variables.py: gathered in the forward and again in the
        backward); None: the parameters are whole.
        """
        # A layer's own nn.with_logical_constraint (a user's flax module) maps its names by
        # the run's rules; jaxpar's layers are pinned by `constrain` alone.
        with nn.logical_axis_rules(() if constrain is None else constrain.rules):
            new_stats = dict(batch_stats)
            first = range(len(self.layers))[layers].start
            for i, layer in enumerate(self.layers[layers], start=first):
                if constrain is not None and x.ndim == 4:
                    x = self._layer_input(i, x, constrain)
                module = layer.module.clone(bn_axis_name=bn_axis_name)
                keys = None
                if train and layer.module.dropout and example is not None:
                    keys = jax.vmap(lambda e, i=i: jax.random.fold_in(jax.random.key(i), e))(
                        example
                    )
                run = functools.partial(_run_layer, module, train)
                if gather is not None:
                    run = gather.wrap(layer.name, run)
                x, updates = run(params[layer.name], batch_stats.get(layer.name), x, keys)
                if updates is not None:
                    # running averages keep their own dtype whatever the compute dtype
                    new_stats[layer.name] = jax.tree.map(
                        lambda new, old: new.astype(old.dtype), updates, batch_stats[layer.name]
                    )
                if constrain is not None:
                    x = constrain(x, layer.module.out_axes, layer.name)
            return x, new_stats

    def _layer_input(self, i: int, x: jax.Array, constrain: Any) -> jax.Array:
        """An image-shaped x constrained to layer i's input layout (apply's `constrain`)."""
        layer = self.layers[i]
        if i > 0:
            # The input in the layer's own layout: the previous output's, except where an
            # axis joins the map from this layer on (spatial), so that the gather happens
            # here and the layer runs whole, not wherever the partitioner would put it.
            x = constrain(x, self.layers[i - 1].module.out_axes, layer.name)
        if x.shape[1] * x.shape[2] > 1 and len(layer.out_shape) == 1:
            # Gather the channels before a flatten, explicitly: a channel-split [h, w, c]
            # does not flatten to a contiguous split (unless h = w = 1), which XLA would
            # otherwise rematerialise out of sight.
            x = constrain(x, (None,) * x.ndim)
        return x

    def summary(self) -> str:
        """A per-layer table: output shape, parameters, forward MFLOPs per example."""
        rows = [f"{'layer':<10} {'output':>16} {'params':>12} {'MFLOPs/ex':>10}"]
        for layer in self.layers:
            rows.append(
                f"{layer.name:<10} {layer.out_shape!s:>16} {layer.params:>12,} "
                f"{layer.flops / 1e6:>10.2f}"
            )
        rows.append(
            f"{'total':<10} {'':>16} {self.num_params:>12,} {self.flops_per_example / 1e6:>10.2f}"
        )
        return "\n".join(rows)


def _run_layer(module, train, params, stats, x, keys):
    """One layer: (output, its new batch statistics or None)."""
    variables = {"params": params}
    if stats is not None:
        variables["batch_stats"] = stats
    if train and stats is not None:
        y, updates = module.apply(variables, x, train=True, keys=keys, mutable=["batch_stats"])
        return y, updates["batch_stats"]
    return module.apply(variables, x, train=train, keys=keys), None


def count_params(tree: Any) -> int:
    return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def logical_names(boxed: dict) -> dict:
    """Logical dimension names of a module's variables, from flax's boxes
    (`nn.get_partition_spec`); statistics as `statistics_names` gives them."""
    params = nn.get_partition_spec(boxed).get("params", {})
    return {"params": params, "batch_stats": statistics_names(params, boxed)}


def statistics_names(params: dict, variables: dict) -> dict:
    """Names of `variables`' batch statistics (BatchNorm's running mean and variance, at any
    depth), from the parameters' names `params`. flax creates them without an initialiser one
    could box, so each takes the names of its module's `scale`, whose dimensions it shares
    (no names where the module has no scale)."""

    def leaf(path, _):
        node = params
        for key in [*(k.key for k in path[:-1]), "scale"]:
            node = node.get(key) if isinstance(node, dict) else None
        return node if isinstance(node, P) else P()

    return jax.tree_util.tree_map_with_path(leaf, nn.unbox(variables.get("batch_stats", {})))


def make_layer(name: str, module: nn.Module, in_shape: tuple[int, ...]) -> Layer:
    """Build a Layer, deriving its output shape, parameter count and variables' logical names
    by abstract evaluation."""
    forward = traced(module, in_shape)
    variables = forward.variables
    return Layer(
        name=name,
        module=module,
        in_shape=tuple(in_shape),
        out_shape=forward.out_shape,
        params=count_params(nn.unbox(variables.get("params", {}))),
        flops=module.flops(tuple(in_shape)),
        names=logical_names(variables),
    )
