"""Tensor (channel) parallelism, alone or with data parallelism: the data-parallel strategy
with the "tensor" axis left to the sharding rules (parallel/tensor.py).

The step is manual over the batch axes (the sync rule's collectives, explicit) and
automatic over the rules axes (tensor): the variables are laid out by the rules, activations are pinned to their logical
layout inside the model (`constrain`), and XLA's SPMD partitioner inserts the collectives at
layer boundaries. Every sync mode runs here: each tensor shard's replicas follow the rule
(e.g. `sharded` splits each shard's optimizer state over its data replicas). With one data
replica the step is plain SPMD under jit (see parallel/replicas.py).
"""

from __future__ import annotations

from jaxpar import axes
from jaxpar import mesh as mesh_lib
from jaxpar.parallel import tensor, variables
from jaxpar.parallel.data import DataParallel


class TensorParallel(DataParallel):
    name = "tensor"
    auto_axes = True

    @classmethod
    def check(cls, config, shape):
        if config.sync.impl != "shard_map":
            return "the tensor axis needs sync.impl=shard_map; pmap is data-parallel only"
        stage = axes.stage_axis(shape)
        if stage and shape[stage] > 1:
            names = tuple(shape)
            first = axes.batch_axes(shape)[0] if axes.batch_axes(shape) else names[0]
            sizes = [
                shape[a] * shape[stage] if a == first else 1 if a == stage else shape[a]
                for a in names
            ]
            return (
                f"strategy=tensor has no stages, but the mesh is {axes.spelled(shape)}; "
                f"use --config.mesh_shape={mesh_lib.spelled_shape(names, sizes)} or "
                "strategy=auto"
            )
        return None

    @classmethod
    def check_model(cls, config, shape, model):
        return tensor.problem(model, variables.rules_on(tensor.rules_from(config), shape), shape)

    def __init__(self, config, model, mesh, tx):
        self.rules = variables.rules_on(tensor.rules_from(config), dict(mesh.shape))
        self.constrain = tensor.Constrain(self.rules, variables.joins(dict(mesh.shape), model))
        super().__init__(config, model, mesh, tx)
        # the rules axes it splits, after the replica axes where replicas are manual:
        # "data+tensor", "node+spatial", "spatial+tensor"
        self.name = "+".join(self.replicas.axes + axes.auto_axes(dict(mesh.shape)))

    def grads_in_layout(self, grads):
        return tensor.constrain_tree(grads, self.rule.variable_specs["params"])
