"""Two nodes of 8x H100 SXM (NVLink 4 inside each) joined by 400 Gb/s InfiniBand (NDR), one
ConnectX-7 NIC per GPU, as in DGX H100 SuperPODs. 16 GPUs.

Run:  python -m jaxpar.predict --profile configs/hardware/h100_sxm_2nodes_ib.py --suite configs/predict/vgg16_partitionings.py --config.global_batch_size=512

Sources and assumptions: as h100_sxm_x8.py inside a node. Between nodes: 400 Gb/s = 50 GB/s
per NIC per direction; NCCL reaches ~45 GB/s per NIC on large messages; we take 45 GB/s per
GPU and 10 us per step (IB + proxy). A group spanning nodes is reduced hierarchically
(reduce-scatter in the node, all-reduce of 1/8 across the nodes on 8 NICs at once, all-gather
in the node). Devices are numbered in mesh order, 8 per node: on a (16,1,1) mesh the data
axis spans both nodes; on (2,1,8) the tensor axis stays inside a node.
"""

import ml_collections

GB = 1e9


def get_config():
    c = ml_collections.ConfigDict()
    c.name = "2 nodes x 8 H100 SXM, 400 Gb/s IB"
    c.num_devices = 16
    c.devices_per_node = 8
    c.peak_flops = {"float32": 494e12, "bfloat16": 989e12}
    c.memory_bytes = 79 * GB
    c.intra = {"bandwidth": 360 * GB, "latency": 5e-6, "rings": 1}
    c.inter = {"bandwidth": 45 * GB, "latency": 10e-6, "rings": 1}
    c.compute_efficiency = 0.4
    c.overlap = 0.0
    c.program_overhead_s = 50e-6  # host dispatch of one compiled program (JAX)
    return c
