"""8 x NVIDIA H100 80GB HBM3, calibrated on one lent H100 by --calibrate-here (2026-11-26 15:57
UTC, JAX 0.11.2, CUDA 13, jaxpar at bd35080; host: Intel(R) Xeon(R) Processor, 16 cores).

Made with:  python -m jaxpar.predict --calibrate-here configs/hardware/h100_here.py
            (on the GPU, through `OUT=... bash benchmarks/gpu_calibration.sh`, which then
            times benchmarks/single_device.py on more models, one process per row)
Run:        python -m jaxpar.predict --validate --profile configs/hardware/h100_here.py

Expect from --validate (on XLA:GPU's own programs compiled here): the fit on the four rows
below (compute_efficiency, matmul_kernel_s; a cost at its bound is said), then each model
left out of a fit on the others: the five CANDIDATES, never fitted, and the rows' own models.
The current figures: docs/predict.md, "What the validation says". Every measured figure below
is what --calibrate-here wrote on the lent GPU and cannot be reproduced without one.

Microbenchmarks on the first device (jaxpar/predict/calibrate/on_device.py, best of 3 repeats):
- float32 matmul GFLOP/s by size: 1024: 34,546.1, 4096: 433,763.5, 8192: 459,131.4
- bfloat16 matmul GFLOP/s by size: 1024: 51,881.0, 4096: 864,828.5, 8192: 857,919.3
  peak_flops: the largest size's rate (the fitted compute_efficiency scales it)
- memory bandwidth (x * 2 + 1 in place over 1,024 MiB): 2995.58 GB/s read + written
- one small kernel inside a program (chains of 32x32 matmuls): 3.09 us -> launch_s
- one tiny jitted program: 36.4 us dispatched without waiting (-> program_overhead_s), 73.5 us
  with a wait after each
- memory per device: 59.38 GiB
- links: PLACEHOLDER: NVLink unknown, 100 GB/s and 5 us assumed; replace with nccl-tests' bus
  bandwidth (edited: NVSwitch as h100_sxm_x8.py, below)

Calibration runs, jaxpar's one-device training step (run_setup.setup), images/sec:
- vgg19:1.0:32:float32:128: 37,421.6
- vgg19:1.0:32:bfloat16:512: 100,954.6
- resnet50:1.0:224:bfloat16:128: 4,768.8
- resnet20:1.0:32:float32:128: 51,053.5
Fitted when the profile loads: compute_efficiency, matmul_kernel_s.

CANDIDATES: jaxpar's one-device step on five more models, timed with
benchmarks/single_device.py in the same session on the same GPU (kernels and peak memory in
use beside each).

Edited after --calibrate-here wrote the file, each edit marked below: the node (8 of these
GPUs on NVSwitch, as h100_sxm_x8.py: the GPU was timed alone), overlap None, and the costs
read from the GPU's kernel traces (benchmarks/gpu_trace.py on traces of ResNet-50 and
AlexNet taken with command buffers off, and of three VGG19 rows): memory_bandwidth and
kernel_s, the memory-bound kernels' costs by class, the first layer's rate
(thin_efficiency) and the tensor-core tile (tile_width, from the narrow convolutions
--calibrate-here times). The ResNet-50 row's left-out error therefore rests partly on its
own trace. --calibrate-here as it is now fits the traced costs itself.
"""

import ml_collections

from configs.hardware import h100_sxm_x8

MEASURED = {
    "platform": "gpu",
    "device_kind": "NVIDIA H100 80GB HBM3",
    "jax": "0.11.2",
    "seconds": 0.5,
    "num_devices": 1,
    "matmul_float32": {1024: 34546132595859.887, 4096: 433763476358918.56, 8192: 459131427582181.4},
    "float32_flops_per_s": 459131427582181.4,
    "matmul_bfloat16": {1024: 51880972109190.71, 4096: 864828486783955.1, 8192: 857919300669354.9},
    "bfloat16_flops_per_s": 857919300669354.9,
    "matmul_flops_per_s": 459131427582181.4,
    "memory_bandwidth_array_bytes": 1073741824,
    "memory_bandwidth": 2995575467988.679,
    "launch_s": 3.635792712066333e-05,
    "sync_call_s": 7.351239078887433e-05,
    "kernel_s": 3.0877187538741243e-06,
    "peak_memory_bytes": 63763906560.0,
}
RUNS = [
    {
        "name": "vgg19:1.0:32:float32:128",
        "model": "vgg19",
        "width": 1.0,
        "batch_norm": True,
        "head": "auto",
        "image_shape": (32, 32, 3),
        "num_classes": 10,
        "dtype": "float32",
        "batch_size": 128,
        "images_per_sec": 37421.57290849476,
    },
    {
        "name": "vgg19:1.0:32:bfloat16:512",
        "model": "vgg19",
        "width": 1.0,
        "batch_norm": True,
        "head": "auto",
        "image_shape": (32, 32, 3),
        "num_classes": 10,
        "dtype": "bfloat16",
        "batch_size": 512,
        "images_per_sec": 100954.58929096199,
    },
    {
        "name": "resnet50:1.0:224:bfloat16:128",
        "model": "resnet50",
        "width": 1.0,
        "batch_norm": True,
        "head": "auto",
        "image_shape": (224, 224, 3),
        "num_classes": 10,
        "dtype": "bfloat16",
        "batch_size": 128,
        "images_per_sec": 4768.842026861549,
    },
    {
        "name": "resnet20:1.0:32:float32:128",
        "model": "resnet20",
        "width": 1.0,
        "batch_norm": True,
        "head": "auto",
        "image_shape": (32, 32, 3),
        "num_classes": 10,
        "dtype": "float32",
        "batch_size": 128,
        "images_per_sec": 51053.51717711202,
    },
]

# benchmarks/single_device.py on the same GPU, same session (runs/gpu_cal/rows.json there)
CANDIDATES = [
    {
        "model": "alexnet",
        "width": 1.0,
        "batch_norm": True,
        "head": "auto",
        "image_shape": (224, 224, 3),
        "num_classes": 10,
        "dtype": "bfloat16",
        "batch_size": 256,
        "images_per_sec": 43436.1,
    },  # 108 GPU kernels, peak 1.66 GiB
    {
        "model": "densenet40",
        "width": 1.0,
        "batch_norm": True,
        "head": "auto",
        "image_shape": (32, 32, 3),
        "num_classes": 10,
        "dtype": "float32",
        "batch_size": 64,
        "images_per_sec": 5825.2,
    },  # 917 GPU kernels, peak 0.94 GiB
    {
        "model": "inception_v3",
        "width": 1.0,
        "batch_norm": True,
        "head": "auto",
        "image_shape": (299, 299, 3),
        "num_classes": 10,
        "dtype": "bfloat16",
        "batch_size": 64,
        "images_per_sec": 2594.4,
    },  # 2246 GPU kernels, peak 3.09 GiB
    {
        "model": "resnet50",
        "width": 1.0,
        "batch_norm": True,
        "head": "auto",
        "image_shape": (224, 224, 3),
        "num_classes": 10,
        "dtype": "float32",
        "batch_size": 128,
        "images_per_sec": 2726.3,
    },  # 1243 GPU kernels, peak 10.49 GiB
    {
        "model": "vgg16",
        "width": 1.0,
        "batch_norm": True,
        "head": "auto",
        "image_shape": (224, 224, 3),
        "num_classes": 10,
        "dtype": "bfloat16",
        "batch_size": 64,
        "images_per_sec": 3005.6,
    },  # 345 GPU kernels, peak 6.09 GiB
]


def get_config():
    c = ml_collections.ConfigDict()
    c.name = "8x H100 80GB HBM3 (calibrated on one, here)"
    c.num_devices = 8  # edited: a node of 8 (the GPU was timed alone)
    c.devices_per_node = 8
    c.peak_flops = {"float32": 459131427582181.4, "bfloat16": 857919300669354.9}
    c.memory_bytes = 63763906560.0
    # edited: the memory-bound kernels' cost from the H100's kernel traces (benchmarks/gpu_trace.py
    # on ResNet-50's, Inception-v3's and AlexNet's), not the streaming microbenchmark's
    # (docs/predict.md, "Figures measured on lent GPUs")
    c.memory_bandwidth = 2.5e12
    c.kernel_s = 2.0e-6
    # edited: each class of memory-bound kernel at its own costs, from
    # the kernel traces of ResNet-50 and AlexNet without command buffers fitted together
    # (benchmarks/gpu_trace.py with both rows; docs/predict.md): a transpose (a weight into
    # cuDNN's layout) and a pooling window move their bytes at about half an elementwise
    # kernel's rate, and a reduction starts slower. A reduction
    # into few results is priced apart, by one result's lane: reduce refitted on the same two
    # traces without those, reduce_few on five (the VGG19 rows' three added: the two hold few
    # of them); `git show 27339c8:docs/predict.md`, "Reductions into few results"
    c.memory_kernel_costs = {
        "elementwise": (1.22e-6, 3.17e12),
        "reduce": (3.12e-6, 2.72e12),
        "reduce_few": (0.73e-6, 1.07e9),
        "transpose": (5.11e-6, 1.37e12),
        "window": (0.0, 1.60e12),
    }
    c.launch_s = 3.0877187538741243e-06
    c.program_overhead_s = 3.635792712066333e-05
    c.compiler = "gpu"
    c.gpu = "h100_sxm"
    # edited: the first layer's convolutions (3 channels) from the H100's own kernel trace,
    # not from this file's microbenchmark, which --calibrate-here did not have yet:
    # ResNet-50's 7x7 stem and AlexNet's 11x11 one, forward and weight gradient, their rates
    # over the bfloat16 matmul's, averaged (docs/predict.md, "Figures measured on lent GPUs")
    c.thin_efficiency = 0.045
    # edited: the tensor-core tile's width, from this GPU's narrow convolutions (here.py's
    # microbenchmark, added after this file was made; run on a lent H100): a 3x3 layer over
    # 256 input features with n = 8 ... 256 output features ran at n / tile_width of the
    # widest rate up to n = tile_width, in float32 and bfloat16 (`git show
    # 27339c8:docs/predict.md`, "Narrow layers on a GPU: the tensor-core tile")
    c.tile_width = 128.0
    # edited: NVLink 4 through NVSwitch and NCCL's LL and LL128 protocols on it, as
    # configs/hardware/h100_sxm_x8.py (sources there)
    nvlink = {"bandwidth": 360e9, "latency": 5e-06, "rings": 1}
    c.intra = {**nvlink, "protocols": h100_sxm_x8.NVLINK4_PROTOCOLS}
    c.inter = {**nvlink, "protocols": h100_sxm_x8.NVLINK4_PROTOCOLS}
    c.overlap = None  # edited: as XLA:GPU schedules the step (h100_sxm_x8.py)
    c.fit = ("compute_efficiency", "matmul_kernel_s")  # edited: kernel_s measured, above
    c.calibration_runs = RUNS
    c.calibration_candidates = CANDIDATES
    return c
