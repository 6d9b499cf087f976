"""Published single-GPU figures on the DGX-1 (P100 SXM2, tf_cnn_benchmarks, synthetic
ImageNet, float32, batch 64): the runs a profile's compute costs are fitted to, and the check
of how a fit on some models carries to the others.

Run:  python -m jaxpar.predict --calibrate configs/predict/dgx1_single_gpu.py \
          --profile configs/hardware/dgx1_p100.py --fit compute_efficiency,conv3x3_efficiency

Prints the fit on all three and each model predicted from a fit on the other two only
(`git show 27339c8:docs/predict.md`, "Carrying a calibration across models"). Inception-v3's figure is derived: seed 003
gives ResNet-50 1.61x its rate.
"""

import ml_collections

from configs.hardware import dgx1_p100


def get_config():
    c = ml_collections.ConfigDict()
    model, size, batch, rate = dgx1_p100.INCEPTION_V3
    c.runs = [
        dgx1_p100.tf_cnn_benchmarks_vgg16(batch_size=64, images_per_sec=154.0),
        dgx1_p100.tf_cnn_benchmarks_run("resnet50", 224, batch_size=64, images_per_sec=219.0),
        dgx1_p100.tf_cnn_benchmarks_run(model, size, batch_size=batch, images_per_sec=rate),
    ]
    return c
