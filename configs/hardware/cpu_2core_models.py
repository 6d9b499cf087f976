"""This machine, for any model and any partitioning: cpu_2core.py with XLA:CPU's memory-bound
kernels priced at the rates their traces show, a kernel's fixed time measured, and the work
collectives inside a step cost the two cores the 8 simulated devices share.

Run:  python -m jaxpar.predict --validate --profile configs/hardware/cpu_2core_models.py
      python -m jaxpar.predict --profile configs/hardware/cpu_2core_models.py --config configs/resnet50.py
      python -m jaxpar.bench --out bench-out --predict configs/hardware/cpu_2core_models.py

Expect from --validate: the six other models of configs/bench/cpu_models.py, each left out of
a fit on the others, and the default suite's 32 partitionings measured here (median |error|,
rank correlation). The current figures: docs/predict.md, "This machine: predicted against
measured".

Figures and their sources (all else is cpu_2core.py's: the pool of shared cores, narrow
matrix kernels, links, host overheads, the collectives' CPU work):
- Memory-bound kernels (every kernel that is not a convolution or a product) at their bytes,
  as XLA's loop fusions read them, over memory_bandwidth, and the kernels that write an array
  from (almost) nothing (the `generate` class: XLA:CPU's iotas and broadcasts of the max-pool
  gradients) at their own bandwidth: each the fit of time = fixed + bytes / bandwidth (the
  fixed part fitted to 0) to its kernels traced in seven models' steps on one simulated
  device (the seven rows of configs/bench/cpu_models.py, traced with
  benchmarks/single_device.py --trace-dir and joined by benchmarks/gpu_trace.py).
- Peak: a device's step runs on both cores (XLA:CPU's thread pool), so two cores' worth
  (with one core's, the fit would sit at its bound).
- A kernel's fixed time (kernel_s) measured, not fitted: the mean of five runs of chains of
  32 and 512 tiny kernels (`python -c "from jaxpar.predict.calibrate import
  micro; print(micro.kernel_report(micro.measure_kernel()))"`, also printed by --calibrate
  ... --pool); it varies from day to day by a fraction of a microsecond, small beside a step.
- One cost fitted, to the same four VGG19 rows as cpu_2core.py: matmuls' fraction of the
  peak (above the rate its traced matrix kernels ran at: the traced kernels overlap, which a
  sum of prices does not).
"""

from configs.hardware import cpu_2core


def get_config():
    c = cpu_2core.get_config()
    c.name = "this CPU, any model: memory-bound kernels at their traced rates"
    c.peak_flops = {"float32": 200e9, "bfloat16": 200e9}  # both cores
    c.memory_bandwidth = 9.51e9
    c.memory_kernel_costs = {"generate": (0.0, 1.68e9)}
    c.kernel_s = 0.39e-6  # measured (micro.measure_kernel), not fitted
    c.fit = ("compute_efficiency",)
    return c
