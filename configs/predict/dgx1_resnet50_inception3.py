"""ResNet-50 and Inception-v3 on the DGX-1 P100 at 1, 2, 4 and 8 GPUs, batch 64 per GPU,
synthetic ImageNet (224x224; 299x299 for Inception-v3), float32, BatchNorm over each GPU's
batch: tf_cnn_benchmarks' setup.

Run:  python -m jaxpar.predict --profile configs/hardware/dgx1_p100.py --suite configs/predict/dgx1_resnet50_inception3.py

Expect each model's predicted images/sec, speedup and efficiency, with seed 003's median
efficiency over tf_cnn_benchmarks' published runs beside (96.42% at 2 GPUs, 96.84% at 4,
93.02% at 8; medians over models and machines, DGX-1 and K80 clouds). ResNet-50's 1-GPU
figure is one of the two the profile is fitted to, so its row matches by construction;
Inception-v3's is predicted from its op classes; nothing multi-GPU was fitted. About 1.5
minutes on 2 CPU cores (8 abstract compiles of the full-size models).
"""

from configs.bench import suite

PER_DEVICE_BATCH = 64
MODELS = {"resnet50": 224, "inception_v3": 299}
SEED_MEDIAN_EFFICIENCY = {2: 0.9642, 4: 0.9684, 8: 0.9302}


def get_config():
    rows = []
    for model, size in MODELS.items():
        for n in (1, 2, 4, 8):
            rows.append(
                {
                    "name": f"{model} data {n}",
                    "config": {
                        "model.name": model,
                        "data.image_shape": (size, size, 3),
                        "mesh_shape": (n, 1, 1),
                        "global_batch_size": PER_DEVICE_BATCH * n,
                    },
                    "reference_efficiency": SEED_MEDIAN_EFFICIENCY.get(n),
                }
            )
    return suite(
        "configs/base.py",
        # tf_cnn_benchmarks normalises over each GPU's batch (no synchronised BatchNorm)
        {
            "model.width": 1.0,
            "data.name": "synthetic",
            "data.num_classes": 1000,
            "sync.batch_norm": "local",
            "measure_noise_scale": False,  # the seed's runs measure none
        },
        rows,
    )
