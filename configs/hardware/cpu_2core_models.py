"""This machine, for any model and any partitioning: cpu_2core.py with XLA:CPU's memory-bound
kernels priced at the rates their traces show, a kernel's fixed time measured, and the work
collectives inside a step cost the two cores the 8 simulated devices share.

Run:  python -m jaxpar.predict --validate --profile configs/hardware/cpu_2core_models.py   # 4 min
      python -m jaxpar.predict --profile configs/hardware/cpu_2core_models.py --config configs/resnet50.py
      python -m jaxpar.bench --out bench-out --predict configs/hardware/cpu_2core_models.py

Expect from --validate (last run 2026-11-27; docs/predict.md, "This machine: predicted
against measured"): the six other models of configs/bench/cpu_models.py, each left out of a
fit on the others, within 10.5% (ResNet-50 the worst); the default suite's 32 partitionings
measured here at a median |error| of 4.7% and a rank correlation of 0.855. Fitted on VGG19
alone, the six come within 8.5% (ResNet-50 +8.5%, VGG16 -7.4%, Inception-v3 -7.3%, AlexNet
-6.8%). The hybrids with a tensor split are still 11-17% fast.

Figures and their sources (all else is cpu_2core.py's: the pool of shared cores, narrow
matrix kernels, links, host overheads, the collectives' CPU work):
- Memory-bound kernels (every kernel that is not a convolution or a product) at their bytes,
  as XLA's loop fusions read them, over 9.51 GB/s, and the kernels that write an array from
  (almost) nothing (the `generate` class: XLA:CPU's iotas and broadcasts of the max-pool
  gradients) over 1.68 GB/s: each the fit of time = fixed + bytes / bandwidth (the fixed
  part fitted to 0) to its kernels traced in seven models' steps on one simulated device
  (6,853 and 98 kernels; the seven rows of configs/bench/cpu_models.py, 2026-11-27, traced
  with benchmarks/single_device.py --trace-dir and joined by benchmarks/gpu_trace.py).
- Peak: a device's step runs on both cores (XLA:CPU's thread pool), so two cores' 200
  GFLOP/s (with one core's, the fit would sit at its bound).
- A kernel's fixed time measured, not fitted: 0.39 us, the mean of five runs on 2026-11-27
  (0.35-0.43 us) of chains of 32 and 512 tiny kernels (`python -c "from jaxpar.predict.calibrate import
  micro; print(micro.kernel_report(micro.measure_kernel()))"`, also printed by --calibrate
  ... --pool). Five runs on 2026-11-28 gave 0.25-0.27 us; on a CPU the difference is small
  (0.39 us is 1.1 ms of Inception-v3's 48 ms step).
- One cost fitted, to the same four VGG19 rows as cpu_2core.py: matmuls at 0.553 of the
  peak (111 GFLOP/s, above the 82 its traced matrix kernels ran at: the traced kernels
  overlap, 201 ms of them in a 182 ms step, which a sum of prices does not).
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
