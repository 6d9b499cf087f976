"""VGG19 on a (data, stage, tensor) mesh: the main job.

Run:  python -m jaxpar.train --config configs/vgg19_hybrid.py

On 8 devices (8 simulated CPU devices by default): 2 data replicas x 4 pipeline stages, 1F1B
over 4 micro-batches. The tensor axis stays at 1 until tensor partitioning lands; then this
becomes (2, 2, 2). Expect the layer and stage tables, progress lines with loss, images/sec
and ETA, accuracy well above chance at the end, and a summary with the pipeline bubble.
"""

from configs import base


def get_config():
    config = base.get_config()
    config.mesh_shape = (2, 4, 1)  # (data, stage, tensor)
    config.pipeline.schedule = "1f1b"
    config.pipeline.num_microbatches = 4  # BatchNorm statistics per micro-batch of 32
    config.pipeline.split = "flops"
    return config
