"""8x Tesla K80 GPUs (4 boards) on PCIe through the host bridge: AWS p2.8xlarge / GCE
n1-highmem-32 with 8 GPUs, the machines of seed 002 and seed 003.

Run:  python -m jaxpar.predict --profile configs/hardware/k80_pcie.py --suite configs/predict/vgg16_partitionings.py
      python -m jaxpar.predict --validate --profile configs/hardware/k80_pcie.py

Expect a line, when the profile loads, that it is priced from XLA:CPU programs on simulated
devices: a K80's compute capability (3.7) is below what CUDA 12, and so JAX's CUDA plugin,
compiles for. --validate prints the two class rates fitted, each model left out of the fit,
then tf_cnn_benchmarks' published K80 tables. The current figures: docs/predict.md, "What the
validation says" (the published tables' last figures, on the retired simulation of XLA:GPU's
fusion: `git show 27339c8:docs/predict.md`).

Sources and assumptions:
- One K80 GPU (GK210, half a board): 4.37 TFLOP/s float32 at boost clock, 12 GB GDDR5
  (~11.4 GB usable) at 240 GB/s (NVIDIA K80 datasheet). No bfloat16: same rate.
  Memory-bound kernels at 0.9 x 240 GB/s (`compiler = "gpu"`: priced as a GPU, on the CPU's
  programs).
- Links: PCIe 3.0 x16 moves ~12 GB/s per direction in practice, but the two GPUs of a board
  share one x16 slot through the board's PLX switch, and seed 002 found the clouds' GPUs
  behind the PCIe host bridge (PHB) without peer-to-peer access, so a ring step is staged
  through host memory (two copies). We take 4 GB/s per device per direction and 25 us per
  ring step (host-staged copy + launch).
- Compute: two class rates (3x3 and 5x5 stride-1 convolutions apart from every other
  matmul) fitted to two published single-GPU figures: tf_cnn_benchmarks' VGG16 at batch 32,
  35.4 images/sec, and ResNet-50 at batch 64, 51.9 (tensorflow.org/performance/benchmarks,
  2017, Google Compute Engine K80; synthetic ImageNet, float32). Seed 003's "4.4x faster on
  P100 than K80" gives 154 / 4.4 = 35 for VGG16, in agreement; it quotes the K80 baselines as
  "30 images/sec on InceptionV3 and 50 images/sec on Resnet50".
- Held out, never fitted: the same page's other single-K80 figures: Inception-v3 30.5
  images/sec (batch 64), ResNet-152 20.0 (batch 32), AlexNet 656 (batch 512); and its 1-8 GPU
  tables of five models on GCE's and AWS's K80s (configs/predict/tf_cnn_benchmarks.py).
- overlap = 0 (all-reduce after the backward).
"""

import ml_collections

from configs.hardware import dgx1_p100

GB = 1e9


def get_config():
    c = ml_collections.ConfigDict()
    c.name = "8x K80 PCIe (host-staged)"
    c.num_devices = 8
    c.devices_per_node = 8
    c.peak_flops = {"float32": 4.37e12, "bfloat16": 4.37e12}
    c.memory_bytes = 11.4 * GB
    c.intra = {"bandwidth": 4 * GB, "latency": 25e-6, "rings": 1}
    c.inter = {"bandwidth": 4 * GB, "latency": 25e-6, "rings": 1}
    c.overlap = 0.0
    c.program_overhead_s = 50e-6  # host dispatch of one compiled program (JAX)
    run = dgx1_p100.tf_cnn_benchmarks_run
    c.calibration_runs = [
        dgx1_p100.tf_cnn_benchmarks_vgg16(batch_size=32, images_per_sec=35.4),
        run("resnet50", 224, batch_size=64, images_per_sec=51.9),
    ]
    c.fit = ("compute_efficiency", "conv3x3_efficiency")
    c.conv3x3_efficiency = 1.0  # a start for the fit
    c.compiler = "gpu"
    c.gpu = "k80"
    c.memory_bandwidth = 0.9 * 240 * GB
    c.calibration_candidates = [
        run("inception_v3", 299, batch_size=64, images_per_sec=30.5),
        run("resnet152", 224, batch_size=32, images_per_sec=20.0),
        {
            **dgx1_p100.tf_cnn_benchmarks_vgg16(batch_size=512, images_per_sec=656.0),
            "model": "alexnet",
        },
    ]
    c.validation = [
        "configs/predict/k80_gce_tf_cnn_benchmarks.py",  # the calibration runs' machine
        "configs/predict/k80_aws_tf_cnn_benchmarks.py",
    ]
    return c
