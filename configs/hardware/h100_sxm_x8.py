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
- Compute: calibrated on one measured single-GPU run (issue 24's figures: one H100 80GB
  HBM3, JAX 0.11.2, CUDA 13, jaxpar at e58f54e, configs/vgg19_data.py at full width,
  synthetic CIFAR-shaped data): float32 at batch 512, 55,925 images/sec. The other three
  measured rows (float32 batch 128: 31,784; bfloat16 batch 128: 27,789; bfloat16 batch 512:
  100,044) are not fitted: configs/predict/h100_vgg19_single.py predicts them beside. The
  uncalibrated assumption (40% of peak) predicted about 82,700 and 165,000 for the batch-512
  rows, 1.5-1.65x too high.
- A fixed cost per step, from the two float32 rows (both single-GPU): 128 / 31,784 = 4.027 ms
  and 512 / 55,925 = 9.155 ms give 2.318 ms that does not scale with the batch (launches of
  the step's many small kernels and the optimizer's per-tensor updates), less the one
  program's 50 us dispatch: step_overhead_s = 2.268 ms. Without it the batch-128 rows are
  predicted 1.7x (float32) and 3.9x (bfloat16) too fast.
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
    c.step_overhead_s = 2.268e-3  # fitted on the two float32 single-GPU rows (above)
    c.calibration = {
        "model": "vgg19", "width": 1.0, "batch_norm": True, "head": "auto",
        "image_shape": (32, 32, 3), "num_classes": 10, "batch_size": 512,
        "images_per_sec": 55_925.0, "dtype": "float32",
    }  # fmt: skip
    c.overlap = 0.0
    c.program_overhead_s = 50e-6  # host dispatch of one compiled program (JAX)
    return c
