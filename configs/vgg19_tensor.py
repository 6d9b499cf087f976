"""VGG19 with conv output channels (and hidden dense features) split over 8 devices.

Run:  python -m jaxpar.train --config configs/vgg19_tensor.py

Every conv kernel [3, 3, c_in, c_out] is split by output channels (the source documents'
example: 64 channels on one GPU become 8 on each of 8), BatchNorm statistics of a channel stay
with its shard, and XLA gathers the channels a conv needs at each layer boundary. See what that
costs without training:  python -m jaxpar.train --config configs/vgg19_tensor.py --explain
"""

from configs import base


def get_config():
    config = base.get_config()
    config.mesh_shape = (1, 1, -1)  # (data, stage, tensor): all devices split the channels
    config.tensor.rules = (("conv_out", "tensor"), ("mlp", "tensor"))
    return config
