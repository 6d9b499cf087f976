"""One node of 8x H100 SXM 80 GB with NVLink 4 through NVSwitch (DGX/HGX H100).

Run:  python -m jaxpar.predict --profile configs/hardware/h100_sxm_x8.py --suite configs/predict/vgg16_partitionings.py

Sources and assumptions:
- H100 SXM: 989.4 TFLOP/s dense bfloat16, 494.7 TFLOP/s dense TF32 (what XLA's default
  precision uses for float32 convolutions and matmuls on Hopper; the 67 TFLOP/s FP32 rate is
  not), from jaxpar/peak_flops.py, which cites NVIDIA's figures; 80 GB HBM3 (~79 GB usable)
  at 3.35 TB/s (NVIDIA H100 datasheet).
- NVLink 4: 18 links x 25 GB/s = 450 GB/s per direction per GPU into the NVSwitches; NCCL
  all-reduce reaches ~360 GB/s bus bandwidth on 8 GPUs (nccl-tests on DGX H100, without
  NVLink SHARP). We take 360 GB/s as one "ring" and 5 us per step.
- Compute: no measured run yet; assumed 40% of peak for VGG-style convolutions at large batch
  (compute_efficiency 0.4). Calibrate from a single-GPU run when one is available:
  `calibration = {...}` as in dgx1_p100.py.
- overlap = 0 (jaxpar's step: all-reduce after the backward).
"""

import ml_collections

from jaxpar import peak_flops

GB = 1e9


def get_config():
    c = ml_collections.ConfigDict()
    c.name = "8x H100 SXM NVLink"
    c.num_devices = 8
    c.devices_per_node = 8
    c.peak_flops = peak_flops.H100_SXM
    c.memory_bytes = 79 * GB
    c.intra = {"bandwidth": 360 * GB, "latency": 5e-6, "rings": 1}
    c.inter = {"bandwidth": 360 * GB, "latency": 5e-6, "rings": 1}  # one node
    c.compute_efficiency = 0.4
    c.overlap = 0.0
    c.program_overhead_s = 50e-6  # host dispatch of one compiled program (JAX)
    return c
