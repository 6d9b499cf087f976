"""This machine: 2 AMD EPYC cores (AVX2, FMA) and 23 GB of RAM, running jaxpar's 8 simulated
CPU devices (`--xla_force_host_platform_device_count=8`) in one process.

Run:  python -m jaxpar.bench --out bench-out --predict configs/hardware/cpu_2core.py
      (the default suite measured here, every row predicted beside its measurement)

Calibrated from single-device measurements only, so that every multi-device row of a sweep is
a check (docs/predict.md, "This machine: predicted against measured"). Made with

    python -m jaxpar.bench --out /tmp/bench_q --repeat 2
    python -m jaxpar.predict --calibrate /tmp/bench_q --profile configs/hardware/cpu_2core.py \
        --fit compute_efficiency,kernel_s --pool

on a quiet machine (load average below 2; another job on the cores shifts every figure):
- The default suite's 1-device row (VGG19 width 0.25, BatchNorm, shapes10, batch 64): 333.9
  images/sec, and one device alone at batch 32 / 16 / 8 (measured by --pool): 317.7 / 302.9 /
  271.2. Two costs fitted to the four (op classes, jaxpar/predict/opclass.py), with the
  two measured below: matmuls at 0.578 x the nominal peak, 6.6 us per kernel; the four come
  back within 1.1%.
- narrow_width 8, measured (jaxpar/predict/micro.py, printed by --pool; 7, 7, 9.25 and 10.25
  in four runs on 2026-11-26): a 3x3 convolution layer's gradient with 2 / 4 / 8 / 16 / 32 /
  64 output features ran at 29 / 53 / 70 / 86 / 88 / 90 GFLOP/s, so a matrix kernel whose
  narrowest GEMM dimension is n runs at n / (n + 8) of its class's rate. A tensor-parallel
  step's convolutions have 2-16 output features per device (VGG19 width 0.25 over 8), which
  is why tensor 8 runs 40% slower than data 8 at the same FLOPs per device.
- forward_speedup 1.34, measured (micro.measure_forward, printed by --pool): the model's
  forward alone on one device at batch 64 takes 46.7 ms (three runs, within 0.2 ms), which
  these rates, fitted to training steps, price at 62.6 ms. XLA:CPU's backward carries
  transposed operands, reversed kernels and max-pool index tensors that its FLOPs do not
  show; a pipeline's forward programs have none of them.
- compute_pool: N simulated devices each running its own copy of that step at batch 64 / N at
  once reach 1.17 / 1.39 / 1.45 times one device's rate (N = 2 / 4 / 8). One device already
  keeps most of both cores busy (XLA:CPU runs a large convolution on several threads), so
  devices add little; smaller per-device programs leave more idle cores to share.
- Peak: 2 cores x ~3 GHz x 32 float32 FLOP/cycle (two 8-wide FMA units) ~ 100 GFLOP/s per
  core; only the fitted fraction of it matters.
- Memory-bound kernels are inside the per-kernel and matmul costs (memory_bandwidth 0): at
  these sizes every buffer sits in the caches.
- Links, measured by the same --pool run (calibrate.measure_links, as nccl-tests measures a
  GPU's): psum of 4 KB and 4 MB per device over 2 / 4 / 8 devices, fitted to the ring
  formula: 25 us per ring step, 4.75 GB/s. Measured with the devices otherwise idle; inside a
  training step the device threads also compete for the cores, which this does not see.
- Overheads, estimated, not measured: ~1 ms per step and ~0.3 ms per program the pipeline
  runner dispatches (2 x M x K programs and M x (K-1) x 2 transfers per step). A bare jitted
  program dispatches in ~4 us here (--pool prints it); the runner's Python bookkeeping per
  event, the transfers and the waits cost more, and 4 us predicts the 8-stage rows 17-20% too
  fast.
"""

import ml_collections

GB = 1e9
# The default suite's model (configs/bench/partitionings.py) on one device.
RUN = {"model": "vgg19", "width": 0.25, "batch_norm": True, "head": "auto", "dtype": "float32",
       "image_shape": (32, 32, 3), "num_classes": 10}  # fmt: skip


def get_config():
    c = ml_collections.ConfigDict()
    c.name = "this CPU: 2 cores, 8 simulated devices"
    c.num_devices = 8
    c.devices_per_node = 8
    c.peak_flops = {"float32": 100e9, "bfloat16": 100e9}  # per core; calibrated below
    c.memory_bytes = 20 * GB / 8  # host RAM shared by 8 devices
    c.intra = {"bandwidth": 4.75 * GB, "latency": 25e-6, "rings": 1}
    c.inter = {"bandwidth": 4.75 * GB, "latency": 25e-6, "rings": 1}
    c.compute_pool = ((2, 1.17), (4, 1.39), (8, 1.45))
    c.overlap = 0.0
    c.narrow_width = 8.0
    c.forward_speedup = 1.34
    c.step_overhead_s = 1e-3
    c.program_overhead_s = 0.3e-3
    c.calibration_runs = [
        {**RUN, "batch_size": batch, "images_per_sec": rate}
        for batch, rate in ((64, 333.9), (32, 317.7), (16, 302.9), (8, 271.2))
    ]
    c.fit = ("compute_efficiency", "kernel_s")
    c.validation = ["configs/predict/cpu_measured.py"]  # measured here: --validate
    return c
