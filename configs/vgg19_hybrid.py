"""VGG19 on a (data, stage, tensor) = (2, 2, 2) mesh: the main job, a three-way hybrid.

Run:  python -m jaxpar.train --config configs/vgg19_hybrid.py

Expect: on 8 devices (8 simulated CPU devices by default), 2 data replicas x 2 pipeline stages
(1F1B over 4 micro-batches) x 2-way channel split inside each stage: the layer and stage
tables, progress lines with loss, images/sec and ETA, evaluations at steps 100, 200 and 300
rising from chance (10%) to above 80%, and a summary with the pipeline bubble. `--explain`
shows layouts, memory and collectives without training.

Figures: docs/config.md, "The main job's figures" (the accuracies depend on the CPU's
floating-point code paths).
"""

from configs import base


def get_config():
    config = base.get_config()
    config.mesh_shape = (2, 2, 2)  # (data, stage, tensor)
    config.pipeline.schedule = "1f1b"
    config.pipeline.num_microbatches = 4  # BatchNorm statistics per micro-batch of 32
    config.pipeline.split = "flops"
    config.tensor.rules = (("conv_out", "tensor"), ("mlp", "tensor"))
    # Adam: with BatchNorm over micro-batches of 32, SGD at 0.05 sits on the loss plateau for
    # 100-200 steps and how fast it leaves varies run to run; Adam leaves it within ~50 steps.
    config.optimizer.name = "adam"
    config.learning_rate = 1e-3
    return config
