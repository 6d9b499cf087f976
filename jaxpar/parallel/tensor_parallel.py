"""Tensor (channel) parallelism, alone or with data parallelism: the data-parallel strategy
with the "tensor" axis left to the sharding rules (parallel/tensor.py).

The step is manual over "data" (the sync rule's collectives, explicit) and automatic over
"tensor": the variables are laid out by the rules, activations are pinned to their logical
layout inside the model (`constrain`), and XLA's SPMD partitioner inserts the collectives at
layer boundaries. Every sync mode runs here: each tensor shard's replicas follow the rule
(e.g. `sharded` splits each shard's optimizer state over its data replicas). With one data
replica the step is plain SPMD under jit (see parallel/replicas.py).
"""

from __future__ import annotations

from jaxpar.mesh import DATA
from jaxpar.parallel import tensor
from jaxpar.parallel.data import DataParallel


class TensorParallel(DataParallel):
    name = "tensor"
    auto_axes = True

    @classmethod
    def check(cls, config, shape):
        data, stage, tensor = shape
        if config.sync.impl != "shard_map":
            return "the tensor axis needs sync.impl=shard_map; pmap is data-parallel only"
        if stage > 1:
            return (f"strategy=tensor has no stages, but mesh_shape is {shape}; use "
                    f"mesh_shape=({data * stage},1,{tensor}) or strategy=auto")  # fmt: skip
        return None

    def __init__(self, config, model, mesh, tx):
        self.rules = tensor.rules_from(config)
        tensor.check(model, self.rules, dict(mesh.shape))
        self.constrain = tensor.constrain_fn(self.rules)
        super().__init__(config, model, mesh, tx)
        if mesh.shape[DATA] > 1:
            self.name = self.name.replace("tensor", "data+tensor", 1)

    def variable_specs(self):
        return tensor.variable_specs(self.model, self.rules)

    def grads_in_layout(self, grads):
        return tensor.constrain_tree(grads, self.rule.variable_specs["params"])
