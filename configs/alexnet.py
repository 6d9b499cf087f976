"""AlexNet as tf_cnn_benchmarks runs it on CIFAR, on the embedded shapes10, data parallel.

Run:  python -m jaxpar.train --config configs/alexnet.py

Expect: the layer table (2 conv stages, 3 dense layers), a progress line every 20 steps, and
about 80% test accuracy at step 200.

Figures: docs/config.md, "Each model's config, run". The model is seed 003's table: 5x5 convs with LRN, dense 384 and 192;
1,756,426 parameters. At 224x224 inputs the same name builds torchvision's ImageNet AlexNet
(61.1M parameters): `--config.data.name=synthetic --config.data.image_shape='(224,224,3)'`.
"""

from configs import base


def get_config():
    config = base.get_config()
    config.model.name = "alexnet"
    config.model.width = 1.0
    config.num_train_steps = 200
    config.learning_rate = 0.05
    config.mesh_shape = (-1, 1, 1)
    return config
