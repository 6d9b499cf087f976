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
- Compute: fitted to the four measured single-GPU runs (one H100 80GB HBM3, JAX 0.11.2, CUDA
  13, jaxpar at e58f54e, configs/vgg19_data.py at full width, synthetic CIFAR-shaped data,
  images/sec; history: jaxpar's step has grown faster since, 37,422 img/s at float32 batch 128
  on 2026-11-26, and configs/hardware/h100_here.py is this GPU measured later): float32 batch
  128: 31,784; bfloat16 batch 128: 27,789; float32 batch 512: 55,925; bfloat16 batch 512:
  100,044. Two costs are fitted (`fit`): the convolutions' fraction of peak, and the host's
  time to launch one kernel. A step takes the longer of the device's work and the host's
  launches (JAX dispatches asynchronously), so a small batch is bound by the launches.
  Fitted on XLA:GPU's own programs for one H100 (compiled here: jaxpar/predict/gputarget.py):
  0.953 of peak and 11.8 us per kernel launched (`python -m jaxpar.predict --validate
  --profile configs/hardware/h100_sxm_x8.py`).
- Priced from XLA:GPU's programs for 8 H100s (`gpu = "h100_sxm"`): every kernel they launch
  (cuDNN convolutions and Triton GEMMs on a roofline, XLA:GPU's fusions at the costs AlexNet's
  kernel trace measured on an H100 80GB HBM3, by class: memory-bound kernels at 2.49 us +
  bytes / 2.45 TB/s, the first layer at 37.4 TFLOP/s); memory per GPU from XLA:GPU's buffer
  assignment.
- Calibration candidate, never fitted: ResNet-50 at 224x224, bfloat16, batch 128, measured on
  an H100 80GB HBM3 with benchmarks/single_device.py: 4,745 images/sec (docs/predict.md, "Measured
  later"). `python -m jaxpar.predict --validate` predicts it from the VGG19 rows alone: 4,673
  (-1.5%).
- overlap = None: as XLA:GPU schedules jaxpar's step. Its collectives are asynchronous and the
  latency-hiding scheduler starts each gradient's all-reduce once the gradient is computed, so
  the predictor sends the gradients one after another from where each is ready in the program
  (jaxpar/predict/overlap.py) and exposes only what outlasts the compute. `--overlap 0`
  prices the all-reduce after the backward instead.
"""

import ml_collections

from jaxpar import peak_flops

GB = 1e9
# configs/vgg19_data.py at full width on CIFAR-shaped synthetic data, one GPU
H100_RUN = {"model": "vgg19", "width": 1.0, "batch_norm": True, "head": "auto",
            "image_shape": (32, 32, 3), "num_classes": 10}  # fmt: skip


def get_config():
    c = ml_collections.ConfigDict()
    c.name = "8x H100 SXM NVLink"
    c.num_devices = 8
    c.devices_per_node = 8
    c.peak_flops = peak_flops.H100_SXM
    c.memory_bytes = 79 * GB
    c.intra = {"bandwidth": 360 * GB, "latency": 5e-6, "rings": 1}
    c.inter = {"bandwidth": 360 * GB, "latency": 5e-6, "rings": 1}  # one node
    c.calibration_runs = [
        {**H100_RUN, "dtype": dtype, "batch_size": batch, "images_per_sec": rate}
        for dtype, batch, rate in (("float32", 128, 31_784.0), ("bfloat16", 128, 27_789.0),
                                   ("float32", 512, 55_925.0), ("bfloat16", 512, 100_044.0))
    ]  # fmt: skip
    c.fit = ("compute_efficiency", "launch_s")
    c.compiler = "gpu"
    c.gpu = "h100_sxm"
    # measured in AlexNet's kernel trace on an H100 80GB HBM3 (docs/predict.md, "Inside the
    # step"): memory-bound kernels at 2.49 us + bytes / 2.45 TB/s, the first layer (3 input
    # channels) and its weight gradient at 37.4 TFLOP/s
    c.memory_bandwidth = 2.45e12
    c.kernel_s = 2.49e-6
    c.thin_efficiency = 37.4e12 / c.peak_flops["bfloat16"]
    # a layer of n < 128 features (or rows) fills n / 128 of each tensor-core tile: measured
    # on an H100 80GB HBM3 by here.py's narrow convolutions (configs/hardware/h100_here.py)
    c.tile_width = 128.0
    # and each class of memory-bound kernel at its own costs, from the same trace
    # (benchmarks/gpu_trace.py)
    c.memory_kernel_costs = {
        "elementwise": (1.84e-6, 3.00e12),
        "reduce": (3.78e-6, 2.67e12),
        # a reduction into few results (opclass.reduction_class), about 1.1 GB/s per result: not in AlexNet's
        # program; from the traces h100_here.py's costs come from (docs/predict.md)
        "reduce_few": (0.73e-6, 1.07e9),
        "transpose": (0.04e-6, 0.83e12),
        "window": (0.0, 1.83e12),
    }
    c.calibration_candidates = [
        {"model": "resnet50", "width": 1.0, "batch_norm": True, "head": "auto",
         "image_shape": (224, 224, 3), "num_classes": 10, "dtype": "bfloat16",
         "batch_size": 128, "images_per_sec": 4745.0},
    ]  # fmt: skip
    c.overlap = None
    c.program_overhead_s = 50e-6  # host dispatch of one compiled program (JAX)
    return c
