"""DenseNet-40 on the embedded shapes10, data parallel; any partitioning is one override.

Run:  python -m jaxpar.train --config configs/densenet40.py
      ... --config.mesh_shape='(2,4,1)'  (a pipeline of 4 stages x 2 data replicas)
      ... --config.mesh_shape='(4,1,2)'  (channels split 2 ways x 4 data replicas)
      ... --config.mesh_shape='(2,2,2)'  (a hybrid)
      ... --config.model.name=densenet100  (the deeper one)

Expect: the layer table (stem, 36 dense layers, 2 transitions, head; 260,698 parameters) and a
progress line every 10 steps; slow on CPUs (concatenations of many thin maps), and only
beginning to learn after these 50 steps (raise num_train_steps for a trained model).

Figures: docs/config.md, "Each model's config, run". The model is tf_cnn_benchmarks'
densenet40_k12 with growth 6 at half width; each dense layer and transition is one cuttable
unit, so any partitioning cuts or splits them.
"""

from configs import base


def get_config():
    config = base.get_config()
    config.model.name = "densenet40"
    config.model.width = 0.5  # growth 6, stem 8 (1.0: the published 12 and 16)
    config.num_train_steps = 50
    config.log_every_steps = 10
    config.eval_every_steps = 0
    config.warmup_steps = 10
    config.learning_rate = 0.1
    config.mesh_shape = (-1, 1, 1)
    return config
