"""Two nodes of 8x H100 SXM (NVLink 4 inside each) joined by 400 Gb/s InfiniBand (NDR), one
ConnectX-7 NIC per GPU, as in DGX H100 SuperPODs. 16 GPUs.

Run:  python -m jaxpar.predict --profile configs/hardware/h100_sxm_2nodes_ib.py --suite configs/predict/vgg16_partitionings.py --config.global_batch_size=512

Expect every row of the suite on 16 H100s (XLA:GPU's programs for 2 x 8 GPUs, compiled here),
the recommendation line last. Nothing multi-node is measured: the compute is h100_sxm_x8.py's
(its fit and its checks).

Sources and assumptions: as h100_sxm_x8.py inside a node (this file starts from it). Between
nodes: 400 Gb/s = 50 GB/s per NIC per direction; NCCL reaches ~45 GB/s per NIC on large
messages; we take 45 GB/s per GPU and 10 us per step (IB + proxy), without NCCL's LL and LL128
protocols (their network figures in tuning.cc depend on the hosts' CPUs; inside a node the
NVLink ones apply, as h100_sxm_x8.py). A group spanning nodes is
reduced hierarchically (reduce-scatter in the node, all-reduce of 1/8 across the nodes on 8
NICs at once, all-gather in the node). Devices are numbered in mesh order, 8 per node: on a
(16,1,1) mesh the data axis spans both nodes; on (2,1,8) the tensor axis stays inside a node.
"""

from configs.hardware import h100_sxm_x8

GB = 1e9


def get_config():
    c = h100_sxm_x8.get_config()
    c.name = "2 nodes x 8 H100 SXM, 400 Gb/s IB"
    c.num_devices = 16  # devices_per_node stays 8
    c.inter = {"bandwidth": 45 * GB, "latency": 10e-6, "rings": 1}
    return c
