"""NVIDIA DGX-1 (2016): 8x Tesla P100 SXM2 16 GB, NVLink 1.0 hybrid cube-mesh, NCCL.

Run:  python -m jaxpar.predict --profile configs/hardware/dgx1_p100.py --suite configs/predict/dgx1_vgg16.py
      python -m jaxpar.predict --validate --profile configs/hardware/dgx1_p100.py

Expect: full-width VGG16 at batch 64 per GPU on 1 / 2 / 4 / 8 P100s, images/sec and
efficiency beside tf_cnn_benchmarks' published efficiency (nothing multi-GPU is fitted).
--validate prints the kernel table's fit, `kernel_s`, each model left out and the published
multi-GPU tables. The current figures, with these commands: docs/predict.md, "What the
validation says". Programs are XLA:GPU's own for P100s, compiled here without a GPU.

Sources and assumptions:
- P100 SXM2: 10.6 TFLOP/s float32, 21.2 TFLOP/s float16 (NVIDIA P100 datasheet), 16 GB HBM2
  at 732 GB/s; ~15.9 GB usable after the CUDA context. Memory-bound kernels at 0.9 x 732
  GB/s (streaming kernels reach about that on HBM2), matrix kernels on a roofline.
- NVLink 1.0: 20 GB/s per direction per link, 4 links per GPU, every GPU linked directly to the
  other three of its quad and to its counterpart in the other quad (DGX-1 system architecture
  white paper, 2017). A P2P copy over one link measures ~18 GB/s per direction
  (p2pBandwidthLatencyTest); NCCL of 2017 moved ring all-reduce traffic at about that rate per
  link. We take 18 GB/s, 1 ring: tf_cnn_benchmarks' `replicated` mode used TensorFlow 1.x's
  bundled NCCL 1.x, which runs one ring (multi-ring NCCL 2 came later). Latency per ring step
  ~10 us (NCCL 1 launch + NVLink hop). Not described (no `peers`): NCCL 1.x builds its ring in
  rank order, so a ring over all eight GPUs in order crosses 3 -> 4 and 7 -> 0, which the cube
  mesh does not wire, through the hosts; describing it moves the NCCL models' 8-GPU rows as
  that cause says but the parameter-server models' rows the wrong way (`git show
  27339c8:docs/predict.md`, "tf_cnn_benchmarks' whole tables").
- Matrix kernels' costs from published per-kernel timings of the P100, not from any model:
  DeepBench's 94 convolution shapes (forward, input and filter gradients; CUDA 8.0.88, cuDNN
  6.0.21: one cuDNN release after tf_cnn_benchmarks' May 2017 runs, which list CUDA 8.0 and
  cuDNN 5.1), configs/hardware/kernels/deepbench_p100.csv, each kernel read as a compiled
  step's convolution is and priced by this profile (`kernel_benchmarks`). Fitted to those
  252 kernels: 3x3 and 5x5 stride-1 convolutions and their gradients (what cuDNN runs as
  Winograd transforms) at one fraction of the float32 peak in direct-convolution FLOPs,
  every other convolution and matmul at another, and a fixed time per matrix kernel
  (--validate prints the fit and its median error).
- Then one cost of whole steps, each kernel's framework and launch time (`kernel_s`), is
  fitted to two published single-GPU figures (tf_cnn_benchmarks, synthetic ImageNet,
  float32, batch 64): VGG16 154 images/sec; ResNet-50 219. It is TensorFlow 1.x's per-op
  time, which the published figures measure; jaxpar's fused XLA program would pay less, so
  steps of small kernels (small batches, 32x32 maps) and XLA:GPU's data-parallel steps (more
  kernels than the one-GPU step, one slice per all-reduced leaf of XLA:GPU's combined
  all-reduce) come out pessimistic for jaxpar here.
- Held out, never fitted: the other single-GPU figures tf_cnn_benchmarks published for the
  DGX-1 (tensorflow.org/performance/benchmarks, 2017; synthetic ImageNet, float32):
  Inception-v3 142 images/sec (batch 64), ResNet-152 91.8 (batch 64), AlexNet 2,987 (batch
  512; their AlexNet has 384 channels in conv4 where jaxpar's, torchvision's, has 256: 5%
  fewer of its FLOPs); and the published 1-8 GPU tables named in `validation`.
- overlap = 0: gradient all-reduce after the backward. In tf_cnn_benchmarks' replicated mode
  it partly overlaps the backward; on XLA:GPU's programs the predictor reads the program's own
  asynchronous pairs instead of this figure (docs/predict.md, "How a step is priced").
"""

import ml_collections

GB = 1e9


def get_config():
    c = ml_collections.ConfigDict()
    c.name = "DGX-1 8x P100 NVLink"
    c.num_devices = 8
    c.devices_per_node = 8
    c.peak_flops = {"float32": 10.6e12, "bfloat16": 21.2e12}  # bf16: P100 has fp16 only
    c.memory_bytes = 15.9 * GB
    c.intra = {"bandwidth": 18 * GB, "latency": 10e-6, "rings": 1}
    c.inter = {"bandwidth": 18 * GB, "latency": 10e-6, "rings": 1}  # one node
    c.overlap = 0.0
    c.step_overhead_s = 0.0
    c.program_overhead_s = 50e-6  # host dispatch of one compiled program (JAX)
    c.calibration_runs = [
        tf_cnn_benchmarks_vgg16(batch_size=64, images_per_sec=154.0),
        tf_cnn_benchmarks_run("resnet50", 224, batch_size=64, images_per_sec=219.0),
    ]
    c.compiler = "gpu"
    c.gpu = "p100_sxm2"
    c.memory_bandwidth = 0.9 * 732 * GB
    # the matrix kernels' costs from DeepBench's P100 kernel timings (jaxpar/predict/kernels/kernel_table.py)
    c.kernel_benchmarks = "configs/hardware/kernels/deepbench_p100.csv"
    c.kernel_fit = ("compute_efficiency", "conv3x3_efficiency", "matmul_kernel_s")
    c.fit = ("kernel_s",)  # what whole steps add: each kernel's framework and launch time
    c.calibration_candidates = [
        tf_cnn_benchmarks_run("inception_v3", 299, batch_size=64, images_per_sec=142.0),
        tf_cnn_benchmarks_run("resnet152", 224, batch_size=64, images_per_sec=91.8),
        {**tf_cnn_benchmarks_vgg16(batch_size=512, images_per_sec=2987.0), "model": "alexnet"},
    ]
    c.validation = [
        "configs/predict/dgx1_tf_cnn_benchmarks.py",  # every model, batch 64 (AlexNet 512)
        "configs/predict/dgx1_tf_cnn_benchmarks_batch32.py",
        "configs/predict/dgx1_resnet50_inception3.py",  # seed 003's median efficiencies
    ]
    return c


# Seed 003's Inception-v3 figure, derived (ResNet-50 trains 1.61x faster): predicted, not fitted.
INCEPTION_V3 = ("inception_v3", 299, 64, 219.0 / 1.61)


def tf_cnn_benchmarks_run(model: str, size: int, batch_size: int, images_per_sec: float) -> dict:
    """A calibration run of a BatchNorm model: one GPU, synthetic ImageNet, float32."""
    return {
        "model": model,
        "width": 1.0,
        "batch_norm": True,
        "image_shape": (size, size, 3),
        "num_classes": 1000,
        "batch_size": batch_size,
        "images_per_sec": images_per_sec,
        "dtype": "float32",
    }


def tf_cnn_benchmarks_vgg16(batch_size: int, images_per_sec: float) -> dict:
    """A calibration run: one GPU's images/sec in tf_cnn_benchmarks' VGG16 (ImageNet head, no
    BatchNorm, synthetic 224x224 images, float32) at `batch_size`."""
    return {
        "model": "vgg16",
        "width": 1.0,
        "head": "imagenet",
        "batch_norm": False,
        "image_shape": (224, 224, 3),
        "num_classes": 1000,
        "batch_size": batch_size,
        "images_per_sec": images_per_sec,
        "dtype": "float32",
    }
