"""VGG19 cut into 4 pipeline stages (FLOP-balanced), 8 micro-batches, 1F1B, on 4 devices x 2
data replicas.

Run:  python -m jaxpar.train --config configs/vgg19_pipeline.py

Expect: the layer table, then the per-stage table (layers, parameters, GFLOPs and MB sent on
per batch), progress lines, and a summary with the analytic bubble (K-1)/(M+K-1) = 3/11 = 0.27
beside the bubble measured from per-stage times. Try --config.pipeline.schedule=gpipe or naive
(with --config.pipeline.num_microbatches=1), and --config.pipeline.split=params or '(4,8,12)'.
"""

from configs import base


def get_config():
    config = base.get_config()
    config.mesh_shape = (-1, 4, 1)  # (data, stage, tensor): 4 stages, the rest data parallel
    config.pipeline.schedule = "1f1b"
    config.pipeline.num_microbatches = 8  # global batch 128 -> micro-batches of 16
    config.pipeline.split = "flops"
    return config
