"""This machine: 2 AMD EPYC cores (AVX2, FMA) and 23 GB of RAM, running jaxpar's 8 simulated
CPU devices (`--xla_force_host_platform_device_count=8`) in one process.

Run:  python -m jaxpar.predict --validate --profile configs/hardware/cpu_2core.py
      python -m jaxpar.bench --out bench-out --predict configs/hardware/cpu_2core.py

Expect from --validate: the default suite's 32 partitionings measured here
(configs/predict/cpu_measured.py) at their median |error| and rank correlation beside the
measurement's own two repeats, and the other models of configs/bench/cpu_models.py left out,
ResNet-50 and AlexNet at 64x64 far too fast, because this profile prices memory-bound kernels
at nothing. It is for the partitionings of the model it is fitted to; for other models use
cpu_2core_models.py. The bench line measures the default suite here and predicts every row
beside its measurement. The current figures: docs/predict.md, "This machine: predicted
against measured".

Made with, on a quiet machine (load average below 2; another job on the cores shifts every
figure):

    python -m jaxpar.bench --out /tmp/bench_q --repeat 2
    python -m jaxpar.predict --calibrate /tmp/bench_q --profile configs/hardware/cpu_2core.py \
        --fit compute_efficiency,kernel_s --pool

Where each figure below comes from (`--pool` is the second command's; it prints each):
- calibration_runs: the default suite's 1-device row (VGG19 width 0.25, BatchNorm,
  shapes10, batch 64) and one device alone at batch 32 / 16 / 8 (--pool). Two costs are
  fitted to these single-device runs only, so that every multi-device row is a check:
  matmuls' fraction of the nominal peak and the time per kernel (op classes).
- Peak: 2 cores x ~3 GHz x 32 float32 FLOP/cycle (two 8-wide FMA units) ~ 100 GFLOP/s per
  core; only the fitted fraction of it matters.
- Memory-bound kernels are inside the per-kernel and matmul costs (memory_bandwidth 0): that
  holds for models with VGG19's ratio of memory-bound bytes to FLOPs and not beyond (the
  CANDIDATES below, measured here, never fitted).
- narrow_width (--pool: a 3x3 convolution layer's gradient timed at 2 to 64 output
  features): a matrix kernel whose narrowest GEMM dimension is n runs at n / (n +
  narrow_width) of its class's rate. A tensor-parallel step's convolutions have few output
  features per device (VGG19 width 0.25 over 8).
- forward_speedup (--pool): the model's forward alone on one device at batch 64, timed,
  against its price at the fitted rates. XLA:CPU's backward carries transposed operands,
  reversed kernels and max-pool index tensors that its FLOPs do not show; a pipeline's
  forward programs have none of them.
- compute_pool (--pool, the mean of three runs): N simulated devices, each running its own
  copy of the step at batch 32, 16 or 8, together reach this many times one device's rate at
  that batch. One device already keeps most of both cores busy; smaller kernels leave more
  of them idle for the other devices. A step is looked up by the mean FLOPs of its matrix
  kernels.
- collective_cpu_rate (--pool: an all-gather and a psum of 1 MB a device on 8 devices,
  beyond local work of their shape, in process CPU time): collectives inside the step (not
  the gradient sync) are work on the 2 cores all devices share, their payload at this rate
  of CPU time, every device of the mesh doing its part.
- Links (--pool: psum of 4 KB and 4 MB per device over 2 / 4 / 8 devices, fitted to the
  ring formula; devices otherwise idle).
- Overheads: step_overhead_s estimated. The pipeline runner's host time (--pool: the
  dispatching thread's CPU time per step of VGG19 at width 0.0625 as GPipe over M = 1/2/4/8
  micro-batches) with one device per stage (K = 2/4/8), fitted per stage, per micro-batch
  and per program or transfer dispatched; each further device of a stage (meshes (D, K, 1))
  adds a cost per stage and per dispatch.
"""

import ml_collections

GB = 1e9
# The default suite's model (configs/bench/partitionings.py) on one device.
RUN = {
    "model": "vgg19",
    "width": 0.25,
    "batch_norm": True,
    "head": "auto",
    "dtype": "float32",
    "image_shape": (32, 32, 3),
    "num_classes": 10,
}

# Other models on one device, measured here (on a quiet machine) with
#     python -m jaxpar.bench --suite cpu_models --out runs/cpu_models --repeat 2
# (configs/bench/cpu_models.py; two repeats' mean [clock]). (model, width, image side,
# batch, images/sec)
CANDIDATES = (
    ("resnet20", 1.0, 32, 64, 199.6),
    ("vgg16", 0.25, 32, 64, 419.8),
    ("resnet50", 0.25, 64, 32, 192.2),
    ("alexnet", 0.25, 64, 64, 365.3),
    ("inception_v3", 0.25, 75, 16, 331.0),
    ("densenet40", 1.0, 32, 32, 22.4),
)


def get_config():
    c = ml_collections.ConfigDict()
    c.name = "this CPU: 2 cores, 8 simulated devices"
    c.num_devices = 8
    c.devices_per_node = 8
    c.peak_flops = {"float32": 100e9, "bfloat16": 100e9}  # per core; calibrated below
    c.memory_bytes = 20 * GB / 8  # host RAM shared by 8 devices
    c.intra = {"bandwidth": 4.75 * GB, "latency": 25e-6, "rings": 1}
    c.inter = {"bandwidth": 4.75 * GB, "latency": 25e-6, "rings": 1}
    c.compute_pool = (  # (N, mean FLOPs of a matrix kernel, speedup): three --pool runs' mean
        (2, 92.9e6, 1.20),
        (4, 92.9e6, 1.37),
        (8, 92.9e6, 1.45),
        (2, 46.5e6, 1.30),
        (4, 46.5e6, 1.49),
        (8, 46.5e6, 1.47),
        (2, 23.2e6, 1.31),
        (4, 23.2e6, 1.49),
        (8, 23.2e6, 1.56),
    )
    c.overlap = 0.0
    c.narrow_width = 8.0
    c.forward_speedup = 1.34
    c.collective_cpu_rate = 3.0e9  # measured (cpulinks.measure_collective_cpu), not fitted
    c.shared_cores = 2
    c.step_overhead_s = 1e-3
    c.program_overhead_s = 73e-6  # the pipeline runner's host time (pipelinehost.measure_host)
    c.stage_overhead_s = 0.47e-3
    c.microbatch_overhead_s = 1.42e-3
    c.stage_device_overhead_s = 0.48e-3  # per further device of a stage
    c.program_device_overhead_s = 59e-6
    c.calibration_runs = [
        {**RUN, "batch_size": batch, "images_per_sec": rate}
        for batch, rate in ((64, 333.9), (32, 317.7), (16, 302.9), (8, 271.2))
    ]
    c.fit = ("compute_efficiency", "kernel_s")
    c.calibration_candidates = [  # never fitted: --validate predicts each from the others
        {
            **RUN,
            "model": model,
            "width": width,
            "image_shape": (side, side, 3),
            "batch_size": batch,
            "images_per_sec": rate,
        }
        for model, width, side, batch, rate in CANDIDATES
    ]
    c.validation = ["configs/predict/cpu_measured.py"]  # measured here: --validate
    return c
