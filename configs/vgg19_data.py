"""VGG19 (quarter width), pure data parallelism over every device, on the embedded dataset.

Run:  python -m jaxpar.train --config configs/vgg19_data.py

Expect: a table of the model's layers, then a progress line every 20 steps (loss falling from
~2.3, images/sec, ETA), evaluations at steps 100, 200, 300 with accuracy rising well above the
10% of chance, and a summary table. Metrics land in WORKDIR/metrics.jsonl and TensorBoard files.
"""

from configs import base


def get_config():
    config = base.get_config()
    config.mesh_shape = (-1, 1, 1)  # (data, stage, tensor): every device holds a replica
    return config
