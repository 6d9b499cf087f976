"""VGG19 (quarter width), data parallel over every device, at 4x its base batch under AdaScale:
the rate follows the measured gradient noise step by step, and the run lasts as long as the
base batch's 300 steps would, in progress.

Run:  python -m jaxpar.train --config configs/vgg19_adascale.py

Expect: the usual opening lines, "gradient noise scale: from 8 groups of 64 images against the
whole batch of 512", then progress lines that count progress (steps at the base batch 128) to
300, each with its step, AdaScale's gain (between 1 and 4) and the noise scale; the run ends
when its progress reaches 300, after about 125 steps (mean gain 2.4), and the summary gives
the progress, the mean gain and the accuracy: 75.4% here (docs/time_to_target.md), where the
same config at batch 128 (gain 1: plain SGD) reaches 88.4% in its 300 steps.

The warmup is 80 steps of progress, not the base config's 20: warmup runs on progress, and at
a gain of 2 early on, 20 of progress are 10 steps, after which this network's accuracy stayed
near 21% to the end (the noise scale is large on the early plateau, so the gain and the rate
rise at once).

BatchNorm is per replica here (sync.batch_norm=local, as PyTorch DDP and AdaptDL have it):
normalised over the global batch, the replicas' gradients are coupled and the noise scale
AdaScale needs cannot be measured from them. Each replica then normalises its own 64 images,
so the function trained is VGG19 with BatchNorm over groups of 64 (not the one-device model
with BatchNorm over 512).
"""

from configs import base


def get_config():
    config = base.get_config()
    config.mesh_shape = (-1, 1, 1)  # (data, stage, tensor): every device holds a replica
    config.sync.batch_norm = "local"  # the noise scale needs each replica's own gradient
    config.lr_adaptation = "adascale"
    config.lr_base_batch_size = 128  # the batch learning_rate and the 300 steps are meant for
    config.global_batch_size = 512  # scale 4: AdaScale's gain lies between 1 and 4
    config.warmup_steps = 80  # in progress: about 35 steps at this batch
    return config
