"""VGG19 on a (data, stage, tensor) mesh: the main job.

Run:  python -m jaxpar.train --config configs/vgg19_hybrid.py

Today this is data parallel over all devices (8 simulated CPU devices by default): the stage
and tensor axes stay at 1 until pipeline and tensor partitioning land. Expect a layer table,
progress lines with loss, images/sec and ETA, accuracy well above chance at the end, and a
summary table. Try `--config.sync.impl=pmap` for the legacy pmap path.
"""

from configs import base


def get_config():
    config = base.get_config()
    config.mesh_shape = (-1, 1, 1)  # (data, stage, tensor); becomes (2, 2, 2) with those axes
    return config
