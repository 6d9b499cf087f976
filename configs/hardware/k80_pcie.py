"""8x Tesla K80 GPUs (4 boards) on PCIe through the host bridge: AWS p2.8xlarge / GCE
n1-highmem-32 with 8 GPUs, the machines of seed 002 and seed 003.

Run:  python -m jaxpar.predict --profile configs/hardware/k80_pcie.py --suite configs/predict/vgg16_partitionings.py

Sources and assumptions:
- One K80 GPU (GK210, half a board): 4.37 TFLOP/s float32 at boost clock, 12 GB GDDR5
  (~11.4 GB usable) at 240 GB/s (NVIDIA K80 datasheet). No bfloat16: same rate.
- Links: PCIe 3.0 x16 moves ~12 GB/s per direction in practice, but the two GPUs of a board
  share one x16 slot through the board's PLX switch, and seed 002 found the clouds' GPUs
  behind the PCIe host bridge (PHB) without peer-to-peer access, so a ring step is staged
  through host memory (two copies). We take 4 GB/s per device per direction and 25 us per
  ring step (host-staged copy + launch).
- Compute: no K80 VGG16 measurement at hand. Seed 003 reports tf_cnn_benchmarks training
  "4.4x faster (median) on P100 than K80"; we calibrate on 154 / 4.4 = 35 images/sec for
  VGG16 (batch 32, float32). Replace it with a measured run when you have one.
- Priced as XLA:GPU would run it (`compiler = "gpu"`): memory-bound kernels at 0.9 x 240 GB/s.
- Calibration candidates, never fitted by this profile: tf_cnn_benchmarks' published single-K80
  figures (tensorflow.org/performance/benchmarks, 2017, Google Compute Engine; synthetic
  ImageNet, float32): Inception-v3 30.5 images/sec (batch 64), ResNet-50 51.9 (batch 64),
  ResNet-152 20.0 (batch 32), AlexNet 656 (batch 512), VGG16 35.4 (batch 32; the 35 derived
  above agrees). Seed 003 quotes the first two as "30 and 50". `--validate` predicts each from
  a fit on the others.
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
    c.calibration = dgx1_p100.tf_cnn_benchmarks_vgg16(batch_size=32, images_per_sec=35.0)
    c.compiler = "gpu"
    c.memory_bandwidth = 0.9 * 240 * GB
    run = dgx1_p100.tf_cnn_benchmarks_run
    c.calibration_candidates = [
        run("inception_v3", 299, batch_size=64, images_per_sec=30.5),
        run("resnet50", 224, batch_size=64, images_per_sec=51.9),
        run("resnet152", 224, batch_size=32, images_per_sec=20.0),
        {**dgx1_p100.tf_cnn_benchmarks_vgg16(batch_size=512, images_per_sec=656.0),
         "model": "alexnet"},
    ]  # fmt: skip
    return c
