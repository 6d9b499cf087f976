"""tf_cnn_benchmarks' published multi-GPU tables (tensorflow.org/performance/benchmarks, May 2017;
TensorFlow's docs_src/performance/benchmarks.md): synthetic ImageNet, float32, images/sec on 1,
2, 4 and 8 GPUs at a fixed batch per GPU, each model as that page configured it. Nothing of
these is fitted: the 1-GPU rows of VGG16 and ResNet-50 (DGX-1 at batch 64, GCE's K80) are the
profiles' calibration runs, the other 1-GPU rows their leave-one-out candidates, and every
multi-GPU row a check of predicted efficiency (`python -m jaxpar.predict --validate`).

The page's sync per model (`variable_update`), which jaxpar does not reproduce (it predicts its
own all-reduce over the profile's links): on the DGX-1, Inception-v3 and the ResNets kept
their parameters on the CPU (parameter_server), AlexNet and VGG16 were replicated with NCCL;
on GCE's K80s every model used a parameter server on the CPU; on AWS's K80s Inception-v3 a
parameter server on the CPU, the ResNets replicated without NCCL, AlexNet and VGG16 a
parameter server on a GPU.

The thin suite files beside (dgx1_tf_cnn_benchmarks.py, ...) name one table each.
"""

from configs.bench import suite

GPUS = (1, 2, 4, 8)
# {table: ({model: batch per GPU}, {model: images/sec on 1, 2, 4, 8 GPUs})}
TABLES = {
    "dgx1": (
        {"inception_v3": 64, "resnet50": 64, "resnet152": 64, "alexnet": 512, "vgg16": 64},
        {
            "inception_v3": (142, 284, 569, 1131),
            "resnet50": (219, 422, 852, 1734),
            "resnet152": (91.8, 181, 356, 716),
            "alexnet": (2987, 5658, 10509, 17822),
            "vgg16": (154, 295, 584, 1081),
        },
    ),
    "dgx1_batch32": (  # the page's "other results"
        {"inception_v3": 32, "resnet50": 32, "resnet152": 32, "vgg16": 32},
        {
            "inception_v3": (128, 259, 520, 995),
            "resnet50": (195, 368, 768, 1485),
            "resnet152": (82.7, 160, 317, 632),
            "vgg16": (144, 281, 549, 820),
        },
    ),
    "k80_gce": (
        {"inception_v3": 64, "resnet50": 64, "resnet152": 32, "alexnet": 512, "vgg16": 32},
        {
            "inception_v3": (30.5, 57.8, 116, 227),
            "resnet50": (51.9, 99.0, 195, 387),
            "resnet152": (20.0, 38.2, 75.8, 148),
            "alexnet": (656, 1209, 2328, 4640),
            "vgg16": (35.4, 64.8, 120, 234),
        },
    ),
    "k80_aws": (
        {"inception_v3": 64, "resnet50": 64, "resnet152": 32, "alexnet": 512, "vgg16": 32},
        {
            "inception_v3": (30.8, 58.7, 117, 230),
            "resnet50": (51.5, 98.0, 195, 384),
            "resnet152": (19.7, 37.6, 74.9, 149),
            "alexnet": (684, 1244, 2479, 4853),
            "vgg16": (36.3, 69.4, 141, 260),
        },
    ),
}
IMAGE_SIZE = {"inception_v3": 299}  # the others 224
NO_BATCH_NORM = ("alexnet", "vgg16")  # tf_cnn_benchmarks' AlexNet and VGG16: no BatchNorm


def table_suite(table: str):
    """One table's rows: each model on 1, 2, 4 and 8 GPUs (data-parallel), with its
    published images/sec as the reference (efficiency against its own 1-GPU figure)."""
    batches, rates = TABLES[table]
    rows = []
    for model, published in rates.items():
        size = IMAGE_SIZE.get(model, 224)
        for n, images_per_sec in zip(GPUS, published):
            config = {
                "model.name": model,
                "data.image_shape": (size, size, 3),
                "mesh_shape": (n, 1, 1),
                "global_batch_size": batches[model] * n,
            }
            if model in NO_BATCH_NORM:
                config |= {"model.head": "imagenet", "model.batch_norm": False}
            rows.append(
                {"name": f"{model} data {n}", "config": config, "reference": float(images_per_sec)}
            )
    # tf_cnn_benchmarks normalises over each GPU's batch (no synchronised BatchNorm) and
    # measures no gradient noise scale (jaxpar's costs a reduction per parameter on a GPU)
    common = {
        "model.width": 1.0,
        "data.name": "synthetic",
        "data.num_classes": 1000,
        "sync.batch_norm": "local",
        "measure_noise_scale": False,
    }
    return suite("configs/base.py", common, rows)
