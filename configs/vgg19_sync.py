"""VGG19 (quarter width) on 8 data replicas that average their parameters every 4 steps
(local SGD), on the embedded dataset. Any other synchronisation mode is one override away.

Run:  python -m jaxpar.train --config configs/vgg19_sync.py
      python -m jaxpar.train --config configs/vgg19_sync.py --config.sync.mode=async \
          --config.sync.max_staleness=4 --config.sync.staleness_aware_lr=True
      python -m jaxpar.train --config configs/vgg19_sync.py --explain   # the communication

Expect: the layer table, progress lines every 20 steps (loss falling from ~2.3), evaluations
at steps 100, 200, 300 of the replicas' average with accuracy well above the 10% of chance,
and a summary table. `--explain` shows one all-reduce of the parameters (run once a period)
and nothing else over "data".
"""

from configs import base


def get_config():
    config = base.get_config()
    config.mesh_shape = (-1, 1, 1)  # every device is a data replica
    config.sync.mode = "local_sgd"  # allreduce, parameter_server, sharded, local_sgd, async, ...
    config.sync.period = 4  # steps between parameter averages
    config.sync.batch_norm = "local"  # replicas train apart between averages
    return config
