"""2x Tesla M60 (one board, Azure NV12), PCIe, parameter server on the CPU: the machine of
seed 003's CIFAR-10 table (az-2x-m60, TensorFlow 1.3, tf_cnn_benchmarks).

Run:  python -m jaxpar.predict --profile configs/hardware/m60_x2.py --suite configs/bench/cifar_models.py
      python -m jaxpar.bench --suite cifar_models --out runs/cifar_models   (its predicted.md)

Expect: the six models seed 003 found to scale (ResNet-32 to 110, both DenseNets) within 5
points of the seed's efficiency on two M60s; AlexNet and ResNet-20 predicted to scale where
the seed's did not; DenseNet-100 at batch 64 not fitting (XLA:CPU's plan). The current table:
docs/predict.md, "Seed 003's CIFAR-10 table on two M60s". Priced from XLA:CPU's programs (no
M60 program is compiled).

Sources and assumptions:
- One M60 GPU (GM204, half a board): 2,048 CUDA cores at up to 1,178 MHz, 4.83 TFLOP/s
  float32 (the board's datasheet: 9.65 TFLOP/s for its two GPUs), 8 GB GDDR5 (~7.5 GB usable)
  at 160 GB/s. No fast half precision on Maxwell: bfloat16 at the float32 rate.
- Links: the board's two GPUs sit behind its PCIe switch on one PCIe 3.0 x16 slot (~12 GB/s
  per direction in practice). Seed 003 ran the variables on the CPU (parameter server): each
  GPU sends its gradients (P bytes) up and reads the parameters (P bytes) back, both GPUs
  through the one slot, so a step moves 2P each way over ~12 GB/s. jaxpar's all-reduce over two
  devices moves P per device per direction (ring formula 2(n-1)/n x P), so pricing it at
  6 GB/s per device gives the same time. Latency 30 us per message (a host-staged copy and a
  kernel launch).
- Compute: no measured M60 figure at hand. Reasoned calibration: the M60 reaches the same
  fraction of its peak on ResNet-50 as the P100 does in tf_cnn_benchmarks (219 images/sec at
  10.6 TFLOP/s, the DGX-1 profile's ResNet-50 calibration): 219 x 24.30 GFLOP / 10.6 TFLOP/s =
  0.502 of peak (24.30 GFLOP: the convolutions and matmuls of jaxpar's compiled ResNet-50
  training step per image at batch 64;
  tests/test_perfmodel.py checks the figure), i.e. 100 images/sec of ResNet-50 on one M60.
  Every model gets that fraction: small CIFAR models at batch 64-128 reach less of the peak on
  a real GPU, which one efficiency cannot show.
- overlap = 0 and no fixed per-step cost: what the prediction leaves out (TensorFlow 1.3's
  per-variable copies to and from the CPU, its CPU-side update) is what the AlexNet and
  ResNet-20 rows miss.
"""

import ml_collections

GB = 1e9


def get_config():
    c = ml_collections.ConfigDict()
    c.name = "2x Tesla M60 PCIe (PS on CPU)"
    c.num_devices = 2
    c.devices_per_node = 2
    c.peak_flops = {"float32": 4.83e12, "bfloat16": 4.83e12}
    c.memory_bytes = 7.5 * GB
    c.intra = {"bandwidth": 6 * GB, "latency": 30e-6, "rings": 1}
    c.inter = {"bandwidth": 6 * GB, "latency": 30e-6, "rings": 1}
    c.overlap = 0.0
    c.program_overhead_s = 50e-6  # host dispatch of one compiled program (JAX)
    c.compute_efficiency = P100_RESNET50_EFFICIENCY
    return c


# The DGX-1 profile's ResNet-50 figure (219 images/sec, 24.30 GFLOP per image) over the
# P100's 10.6 TFLOP/s: the fraction of peak the M60 is assumed to reach.
P100_RESNET50_EFFICIENCY = 219.0 * 24.30e9 / 10.6e12
