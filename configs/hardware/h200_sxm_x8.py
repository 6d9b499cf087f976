"""One node of 8x H200 SXM 141 GB (HGX H200): the H100's compute and NVLink, more and faster
memory.

Run:  python -m jaxpar.predict --validate --profile configs/hardware/h200_sxm_x8.py

Expect: the fit (the convolutions' fraction of peak) on its one VGG19 row; the two ResNet-50
rows, never fitted, predicted from it; VGG19 predicted from the two ResNet-50 rows. The
current figures: docs/predict.md, "What the validation says". Programs are XLA:GPU's own for
H200s, compiled here without a GPU.

Sources and assumptions:
- H200 SXM: the H100 SXM's tensor cores (989.4 TFLOP/s dense bfloat16, 494.7 TF32:
  jaxpar/peak_flops.py), 141 GB HBM3e (~139 GB usable) at 4.8 TB/s (NVIDIA H200 datasheet);
  NVLink 4 through NVSwitch as the H100's (configs/hardware/h100_sxm_x8.py).
- Memory-bound kernels at 0.9 x 4.8 TB/s, matrix kernels on a roofline. No H200 kernel was
  traced, so memory-bound kernels are not priced by class (the H100's per-class bandwidths
  are the H100's memory's). The first layer's rate and the tensor-core tile (128) are the
  H100 profile's (the same tensor cores and cuDNN; an H200's narrow convolutions, timed by
  --calibrate-here on a lent H200, fit the same width).
- The host's launch time per kernel is the H100 node's as fitted before its programs were
  XLA:GPU's own (`git log -S9.58e-6 configs/hardware/`): at its fit on those
  this profile's one row is bound by the host's launches and says nothing of the
  convolutions' rate (--validate prints both).
- Calibration: three single-GPU rows measured on a lent H200 (JAX 0.11.2, CUDA 13; not
  reproducible without a GPU) with `python benchmarks/single_device.py --seconds 2 --rows
  resnet50:224:bfloat16:256,vgg19:32:bfloat16:512,resnet50:224:float32:128` (jaxpar's
  one-device step, synthetic data, 10 classes, BatchNorm, full width; the rows are
  `calibration_runs` and `calibration_candidates` below). The profile fits the VGG19 row
  alone (the convolutions' fraction of peak); the two ResNet-50 rows are held out.
  single_device.py trains with plain SGD where the profile's runs use the base config's
  optimizer: a difference of one memory-bound update per step.
- overlap = None: as the H100 profile.
"""

from configs.hardware import h100_sxm_x8

GB = 1e9
RUN = {"width": 1.0, "batch_norm": True, "head": "auto", "num_classes": 10}


def get_config():
    c = h100_sxm_x8.get_config()
    c.name = "8x H200 SXM NVLink"
    c.memory_bytes = 139 * GB
    c.gpu = "h200_sxm"
    c.memory_bandwidth = 0.9 * 4.8e12
    # the H100 profile's launch time as fitted before its programs were XLA:GPU's own
    # (docstring): at its current fit this profile's one row would be launch-bound
    c.launch_s = 9.58e-6
    c.kernel_s = 0.35e-6
    # no trace of an H200's kernels: every memory-bound kernel at the bandwidth above (the
    # H100's per-class bandwidths are the H100's memory's)
    c.memory_kernel_costs = {}
    # the tensor-core tile (tile_width, from the H100 profile): an H200's narrow
    # convolutions, timed by --calibrate-here on a lent H200, fit the same (docs/predict.md)
    c.calibration_runs = [
        {
            **RUN,
            "model": "vgg19",
            "image_shape": (32, 32, 3),
            "dtype": "bfloat16",
            "batch_size": 512,
            "images_per_sec": 111_992.0,
        },
    ]
    c.fit = ("compute_efficiency",)
    c.calibration_candidates = [
        {
            **RUN,
            "model": "resnet50",
            "image_shape": (224, 224, 3),
            "dtype": "bfloat16",
            "batch_size": 256,
            "images_per_sec": 6_324.0,
        },
        {
            **RUN,
            "model": "resnet50",
            "image_shape": (224, 224, 3),
            "dtype": "float32",
            "batch_size": 128,
            "images_per_sec": 3_384.0,
        },
    ]
    return c
