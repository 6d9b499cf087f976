"""Worked example of a new sharding rule: split conv kernels by INPUT channels over `tensor`,
on a (2, 1, 4) mesh, instead of the default output-channel split.

Run:  python -m jaxpar.train --config configs/vgg19_conv_in.py [--explain]

Each device then multiplies its slice of the input channels and the partial sums are reduced
(the "row-parallel" half of Megatron's pairing), so activations leave each conv whole and the
collectives are reductions rather than gathers: compare `--explain` with configs/vgg19_tensor.py.
This file is the whole change: a rule is data, not code.
"""

from configs import base


def get_config():
    config = base.get_config()
    config.mesh_shape = (2, 1, 4)  # (data, stage, tensor)
    config.tensor.rules = (("conv_in", "tensor"),)
    return config
