"""2x GeForce GTX 1080 Ti on PCIe: seed 000's server (ASUS Z10PE-D8 WS, 2x Xeon E5-2620 v4).

Run:  python -m jaxpar.predict --profile configs/hardware/gtx1080ti_x2.py --suite configs/predict/vgg16_partitionings.py

Expect predictions for the suite's rows of 1 and 2 devices (the others need more GPUs than
the profile has), from XLA:GPU's own programs for a GTX 1080 Ti compiled here. No whole-model
figure of this GPU is at hand, so nothing checks them: replace the costs with your own
measurement (`python -m jaxpar.predict --calibrate`) when you have one.

Sources and assumptions:
- GTX 1080 Ti: 11.3 TFLOP/s float32 at boost clock, 11 GB GDDR5X (~10.5 GB usable) at
  484 GB/s (NVIDIA specifications); memory-bound kernels at 0.9 x 484 GB/s. No fast
  float16/bfloat16 path on consumer Pascal.
- Link: PCIe 3.0 x16 per card; GeForce drivers disable peer-to-peer, and on a two-socket board
  the cards may sit on different sockets (QPI), so NCCL stages through host memory. We take
  5 GB/s per direction and 20 us per ring step.
- Matrix kernels from DeepBench's published kernel timings of a GTX 1080 Ti (94 convolution
  shapes, forward and both gradients, CUDA 8.0.88, cuDNN 6.0.21:
  configs/hardware/kernels/deepbench_gtx1080ti.csv; fitted to them: 3x3/5x5 stride-1
  kernels' and the others' fractions of peak and a time per kernel, which `python -m
  jaxpar.predict --validate --profile configs/hardware/gtx1080ti_x2.py` prints with the fit's
  median error).
- Each kernel's framework and launch time (kernel_s): the DGX-1 profile's fit of TensorFlow
  1.x's per-op time (which seed 000's server ran too) on the programs it priced when this
  was set (`git log -S37e-6 configs/hardware/`); configs/hardware/dgx1_p100.py fits its own
  now.
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
    c.compiler = "gpu"
    c.gpu = "gtx1080ti"
    c.memory_bandwidth = 0.9 * 484 * GB
    c.kernel_benchmarks = "configs/hardware/kernels/deepbench_gtx1080ti.csv"
    c.kernel_s = 37e-6  # configs/hardware/dgx1_p100.py's fitted per-kernel time (TensorFlow 1.x)
    c.overlap = 0.0
    c.program_overhead_s = 50e-6  # host dispatch of one compiled program (JAX)
    return c
