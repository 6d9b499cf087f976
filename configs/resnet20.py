"""ResNet-20 (He et al., CIFAR, half width) on the embedded shapes10, data parallel; the same
model under any other partitioning is one override.

Run:  python -m jaxpar.train --config configs/resnet20.py
      ... --config.mesh_shape='(2,4,1)'  (pipeline: 4 stages of residual blocks, GPipe,
          x 2 data replicas)
      ... --config.mesh_shape='(1,1,8)'  (tensor: channels split 8 ways)
      ... --config.mesh_shape='(2,2,2)' --config.pipeline.schedule=1f1b
          --config.pipeline.num_microbatches=4  (hybrid)
      ... --config.model.name=resnet56 (or 32, 44, 110)

Expect: the block table (stem, 9 residual blocks, head: 68,050 parameters at half width), a
progress line every 20 steps and about 95% test accuracy at step 200.

Figures: docs/config.md, "Each model's config, run".
"""

from configs import base


def get_config():
    config = base.get_config()
    config.model.name = "resnet20"
    config.model.width = 0.5  # channels 8/16/32 (1.0: the published 16/32/64)
    config.num_train_steps = 200
    config.warmup_steps = 10
    config.learning_rate = 0.1
    config.weight_decay = 5e-4
    config.mesh_shape = (-1, 1, 1)
    return config
