"""ResNet-50 v1.5 at an eighth of its width on synthetic ImageNet-shaped images, 1F1B pipeline
of bottleneck blocks x 2 data replicas: a throughput config, it does not learn.

Run:  python -m jaxpar.train --config configs/resnet50.py

Expect: the block table (stem, 16 bottlenecks, head), the per-stage table of 4 stages, a
progress line every 5 steps with images/sec, and a summary with the pipeline bubble. The
labels are random (tf_cnn_benchmarks' synthetic mode: 224x224, 1000 classes), so the loss stays
near log(1000). `--config.model.name=resnet152` for the deeper one;
`--config.model.name=inception_v3 --config.data.image_shape='(299,299,3)'` for Inception-v3.

Figures: docs/config.md, "Each model's config, run". The model is torchvision's
(25,557,032 parameters at full width and 1000 classes).
"""

from configs import base


def get_config():
    config = base.get_config()
    config.model.name = "resnet50"
    config.model.width = 0.125
    config.data.name = "synthetic"
    config.data.image_shape = (224, 224, 3)
    config.data.num_classes = 1000
    config.data.num_train = 1024
    config.data.num_eval = 64
    config.global_batch_size = 32
    config.num_train_steps = 20
    config.log_every_steps = 5
    config.eval_every_steps = 0
    config.checkpoint_every_steps = 0
    config.warmup_steps = 0
    config.mesh_shape = (2, 4, 1)
    config.pipeline.schedule = "1f1b"
    config.pipeline.num_microbatches = 4
    return config
