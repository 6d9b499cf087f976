"""This machine: 2 AMD EPYC cores (AVX2, FMA) and 23 GB of RAM, running jaxpar's 8 simulated
CPU devices (`--xla_force_host_platform_device_count=8`) in one process.

Run:  python -m jaxpar.predict --profile configs/hardware/cpu_2core.py --suite configs/predict/cpu_measured.py

Sources and assumptions:
- Peak: 2 cores x ~3 GHz x 32 float32 FLOP/cycle (two 8-wide FMA units) ~ 100 GFLOP/s per
  core. Only the calibrated rate matters below.
- Compute: calibrated on the single-device row only, `jaxpar.trainer.train_and_evaluate` on
  the first device (VGG19 width 0.125, BatchNorm, 32x32 shapes10, batch 64, 20 steps, median
  step): 323.4 and 363.6 images/sec in two runs, mean 343.5. Other jobs shared the cores
  (load average 8-13), so treat it as that hour's rate.
- compute_pool = 2: the simulated devices share the two cores. One device's program keeps
  about one core busy (XLA:CPU runs a device's ops mostly on one thread), so 2 or more busy
  devices split 2 cores' worth of compute; the single-device rate is per core.
- "Links" are memory copies between threads in one process, plus a rendezvous of the device
  threads per collective: we take 5 GB/s and 50 us per ring step.
- Overheads: the host dispatches every program; ~1 ms per step and ~0.3 ms per program
  (pipelines dispatch 2 x M x K programs and M x (K-1) x 2 transfers per step).
"""

import ml_collections

GB = 1e9


def get_config():
    c = ml_collections.ConfigDict()
    c.name = "this CPU: 2 cores, 8 simulated devices"
    c.num_devices = 8
    c.devices_per_node = 8
    c.peak_flops = {"float32": 100e9, "bfloat16": 100e9}  # per core; calibrated below
    c.memory_bytes = 20 * GB / 8  # host RAM shared by 8 devices
    c.intra = {"bandwidth": 5 * GB, "latency": 50e-6, "rings": 1}
    c.inter = {"bandwidth": 5 * GB, "latency": 50e-6, "rings": 1}
    c.compute_pool = 2
    c.overlap = 0.0
    c.step_overhead_s = 1e-3
    c.program_overhead_s = 0.3e-3
    c.calibration = {
        "model": "vgg19",
        "width": 0.125,
        "head": "cifar",
        "batch_norm": True,
        "image_shape": (32, 32, 3),
        "num_classes": 10,
        "batch_size": 64,
        "images_per_sec": 343.5,
        "dtype": "float32",
    }
    return c
