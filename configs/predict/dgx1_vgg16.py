"""The validation suite: VGG16 with the ImageNet head on 1, 2, 4 and 8 GPUs, batch 64 per GPU,
synthetic 224x224 images, float32, no BatchNorm: tf_cnn_benchmarks' published DGX-1 setup.

Run:  python -m jaxpar.predict --profile configs/hardware/dgx1_p100.py --suite configs/predict/dgx1_vgg16.py

Expect predicted images/sec against the published 154 / 295 / 584 / 1081 (the 1-GPU figure is
one of the two the profile is fitted to, so that row matches by construction).
"""

from configs.bench import suite

PER_DEVICE_BATCH = 64
PUBLISHED = {1: 154.0, 2: 295.0, 4: 584.0, 8: 1081.0}  # tf_cnn_benchmarks, DGX-1, VGG16


def get_config():
    return suite(
        "configs/base.py",
        {
            "model.name": "vgg16",
            "model.width": 1.0,
            "model.head": "imagenet",
            "model.batch_norm": False,
            "data.name": "synthetic",
            "data.image_shape": (224, 224, 3),
            "data.num_classes": 1000,
            "measure_noise_scale": False,  # tf_cnn_benchmarks measures none
        },
        (
            {
                "name": f"data {n}",
                "config": {"mesh_shape": (n, 1, 1), "global_batch_size": PER_DEVICE_BATCH * n},
                "reference": images_per_sec,
            }
            for n, images_per_sec in PUBLISHED.items()
        ),
    )
