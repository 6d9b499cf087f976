"""2x GeForce GTX 1080 Ti on PCIe: seed 000's server (ASUS Z10PE-D8 WS, 2x Xeon E5-2620 v4).

Run:  python -m jaxpar.predict --profile configs/hardware/gtx1080ti_x2.py --suite configs/predict/vgg16_partitionings.py

Sources and assumptions:
- GTX 1080 Ti: 11.3 TFLOP/s float32 at boost clock, 11 GB GDDR5X (~10.5 GB usable) at
  484 GB/s (NVIDIA specifications). No fast float16/bfloat16 path on consumer Pascal.
- Link: PCIe 3.0 x16 per card; GeForce drivers disable peer-to-peer, and on a two-socket board
  the cards may sit on different sockets (QPI), so NCCL stages through host memory. We take
  5 GB/s per direction and 20 us per ring step.
- Compute: no measured run; we assume the P100's fitted rates per peak FLOP (dgx1_p100.py:
  3x3 convolutions 1.38, cuDNN Winograd; other matmuls 0.37) reduced by a tenth for the
  slower memory: conv3x3_efficiency 1.24, compute_efficiency 0.33. Replace with your own
  measurement (`python -m jaxpar.predict --calibrate`) when you have one.
- overlap = 0 (all-reduce after the backward).
"""

import ml_collections

GB = 1e9


def get_config():
    c = ml_collections.ConfigDict()
    c.name = "2x GTX 1080 Ti PCIe"
    c.num_devices = 2
    c.devices_per_node = 2
    c.peak_flops = {"float32": 11.3e12, "bfloat16": 11.3e12}
    c.memory_bytes = 10.5 * GB
    c.intra = {"bandwidth": 5 * GB, "latency": 20e-6, "rings": 1}
    c.inter = {"bandwidth": 5 * GB, "latency": 20e-6, "rings": 1}
    c.compute_efficiency = 0.33
    c.conv3x3_efficiency = 1.24
    c.overlap = 0.0
    c.program_overhead_s = 50e-6  # host dispatch of one compiled program (JAX)
    return c
