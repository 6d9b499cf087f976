"""One node of 8x H100 SXM 80 GB with NVLink 4 through NVSwitch (DGX/HGX H100).

Run:  python -m jaxpar.predict --profile configs/hardware/h100_sxm_x8.py --suite configs/predict/h100_vgg19_single.py
      python -m jaxpar.predict --validate --profile configs/hardware/h100_sxm_x8.py
      python -m jaxpar.predict --profile configs/hardware/h100_sxm_x8.py --suite configs/predict/vgg16_partitionings.py

Expect: the first command prints the four VGG19 rows it is fitted to, predicted beside
measured; --validate prints the fit (the convolutions' fraction of peak and the time per
kernel launched) and ResNet-50 at 224, never fitted, predicted from the VGG19 rows alone. The
current figures, with these commands: docs/predict.md, "What the validation says". Programs
are XLA:GPU's own for 8 H100s, compiled here without a GPU
(jaxpar/predict/programs/gputarget.py; requirements-gpu-compile.txt).

Sources and assumptions:
- H100 SXM: 989.4 TFLOP/s dense bfloat16, 494.7 TFLOP/s dense TF32 (what XLA's default
  precision uses for float32 convolutions and matmuls on Hopper; the 67 TFLOP/s FP32 rate is
  not), from jaxpar/peak_flops.py, which cites NVIDIA's figures; 80 GB HBM3 (~79 GB usable)
  at 3.35 TB/s (NVIDIA H100 datasheet).
- NVLink 4: 18 links x 25 GB/s = 450 GB/s per direction per GPU into the NVSwitches; NCCL
  all-reduce reaches ~360 GB/s bus bandwidth on 8 GPUs (nccl-tests on DGX H100, without
  NVLink SHARP). We take 360 GB/s as one "ring" and 5 us per step.
- NCCL's protocols for small and middling messages, from its own cost model (NCCL 2.30.7,
  src/graph/tuning.cc: baseLatencies and hwLatencies[NVLINK] for Ring; the LL and LL128
  bandwidth refinements of ncclTopoTuneModel): LL 6.6 us + 0.6 us per ring step at
  min(0.5 x bus bandwidth, llMaxBws[Hopper][1 node] = 141 GB/s), 141/360 of ours; LL128
  14 us + 1.9 us per step at 0.92 of it (its cap, nChannels x 36.7 GB/s, binds only below
  10 channels). The latencies are also 2.20.5's; LL's bandwidth is since 2.21.5 (before:
  a quarter of the bus bandwidth, at most 87.7 GB/s on Hopper). A ring collective takes the
  cheapest of these and the link's own price (jaxpar/predict/comm/links.py): by these figures an
  8-GPU all-reduce of 8 KB costs 15.1 us by LL against 70 us at 5 us a step; from about 3.3
  MB it goes by LL128, above about 69 MB at the link's own.
  (NCCL's own Simple, 8.4 + 3.4 us a step, 56 us on 8 GPUs, is not used: the 5 us above
  stays the profile's assumption.)
- Compute, fitted (`fit`: the convolutions' fraction of peak and the host's time to launch
  one kernel) to four single-GPU runs measured on a lent H100 80GB HBM3 (JAX 0.11.2, CUDA 13,
  jaxpar at e58f54e, configs/vgg19_data.py at full width, synthetic CIFAR-shaped data; not
  reproducible without a GPU; `calibration_runs` below, and docs/predict.md, "Figures
  measured on lent GPUs"). A step takes the longer of
  the device's work and the host's launches (JAX dispatches asynchronously), so a small batch
  is bound by the launches.
- Memory-bound kernels by class and the first layer (3 input channels), from AlexNet's
  kernel trace on the same lent GPU (bfloat16, batch 256; benchmarks/gpu_trace.py); reductions
  into few results by one result's lane (from the traces h100_here.py's costs come from).
  tile_width: a layer of n < tile_width features fills n / tile_width of each tensor-core tile
  (from a lent H100's narrow convolutions, `--calibrate-here`). Commands and figures:
  docs/predict.md, "Figures measured on lent GPUs".
- Held out, never fitted: ResNet-50 at 224x224, bfloat16, batch 128, measured on a lent H100
  80GB HBM3 with `python benchmarks/single_device.py --rows resnet50:224:bfloat16:128`
  (`calibration_candidates` below).
- overlap = None: as XLA:GPU schedules the step (asynchronous collectives, each gradient's
  all-reduce started once it is computed). On XLA:GPU's programs the predictor reads their
  asynchronous pairs: each gradient's reduction hides under the work XLA:GPU schedules between
  its start and its done (docs/predict.md, "How a step is priced").
"""

import ml_collections

from jaxpar import peak_flops

GB = 1e9
# configs/vgg19_data.py at full width on CIFAR-shaped synthetic data, one GPU
H100_RUN = {
    "model": "vgg19",
    "width": 1.0,
    "batch_norm": True,
    "head": "auto",
    "image_shape": (32, 32, 3),
    "num_classes": 10,
}


# NCCL's ring protocols over NVLink on Hopper, {name: (seconds once, seconds per ring step,
# fraction of the link's bandwidth)} (NCCL 2.30.7, src/graph/tuning.cc; docstring above)
NVLINK4_PROTOCOLS = {
    "LL": (6.6e-6, 0.6e-6, min(0.5, 141 * GB / (360 * GB))),
    "LL128": (14.0e-6, 1.9e-6, 0.92),
}


def get_config():
    c = ml_collections.ConfigDict()
    c.name = "8x H100 SXM NVLink"
    c.num_devices = 8
    c.devices_per_node = 8
    c.peak_flops = peak_flops.H100_SXM
    c.memory_bytes = 79 * GB
    nvlink = {"bandwidth": 360 * GB, "latency": 5e-6, "rings": 1}
    c.intra = {**nvlink, "protocols": NVLINK4_PROTOCOLS}
    c.inter = {**nvlink, "protocols": NVLINK4_PROTOCOLS}  # one node
    c.calibration_runs = [
        {**H100_RUN, "dtype": dtype, "batch_size": batch, "images_per_sec": rate}
        for dtype, batch, rate in (
            ("float32", 128, 31_784.0),
            ("bfloat16", 128, 27_789.0),
            ("float32", 512, 55_925.0),
            ("bfloat16", 512, 100_044.0),
        )
    ]
    c.fit = ("compute_efficiency", "launch_s")
    c.compiler = "gpu"
    c.gpu = "h100_sxm"
    # from AlexNet's kernel trace on a lent H100 80GB HBM3 (benchmarks/gpu_trace.py;
    # docs/predict.md, "Figures measured on lent GPUs"): memory-bound kernels' fixed time and
    # bandwidth, the first layer's (3 input channels) rate and its weight gradient's
    c.memory_bandwidth = 2.45e12
    c.kernel_s = 2.49e-6
    c.thin_efficiency = 37.4e12 / c.peak_flops["bfloat16"]
    # a layer of n < 128 features (or rows) fills n / 128 of each tensor-core tile: from a
    # lent H100's narrow convolutions (--calibrate-here; configs/hardware/h100_here.py)
    c.tile_width = 128.0
    # and each class of memory-bound kernel at its own costs, from the same trace
    # (benchmarks/gpu_trace.py)
    c.memory_kernel_costs = {
        "elementwise": (1.84e-6, 3.00e12),
        "reduce": (3.78e-6, 2.67e12),
        # a reduction into few results (opclass.reduction_class), priced per result: not in
        # AlexNet's program; from the traces h100_here.py's costs come from (docs/predict.md)
        "reduce_few": (0.73e-6, 1.07e9),
        "transpose": (0.04e-6, 0.83e12),
        "window": (0.0, 1.83e12),
    }
    c.calibration_candidates = [
        {
            "model": "resnet50",
            "width": 1.0,
            "batch_norm": True,
            "head": "auto",
            "image_shape": (224, 224, 3),
            "num_classes": 10,
            "dtype": "bfloat16",
            "batch_size": 128,
            "images_per_sec": 4745.0,
        },
    ]
    c.overlap = None
    c.program_overhead_s = 50e-6  # host dispatch of one compiled program (JAX)
    return c
