"""VGG19 at full width on one H100: the four rows measured on one H100 80GB HBM3 (issue 24:
JAX 0.11.2, CUDA 13, configs/vgg19_data.py, synthetic CIFAR-shaped data), predicted by the
H100 profile, which fits two costs to the four of them (the convolutions' fraction of peak,
the host's time per kernel launched).

Run:  python -m jaxpar.predict --profile configs/hardware/h100_sxm_x8.py --suite configs/predict/h100_vgg19_single.py

Expect four rows of predicted images/sec, each beside its measured figure (`reference`),
all within 10% (tests/test_perfmodel.py checks the fit).
"""

from configs.bench import suite

# (dtype, batch) -> measured images/sec on one H100 80GB HBM3.
MEASURED = {
    ("float32", 128): 31_784,
    ("bfloat16", 128): 27_789,
    ("float32", 512): 55_925,
    ("bfloat16", 512): 100_044,
}


def get_config():
    rows = [
        {
            "name": f"vgg19 {dtype} batch {batch} (measured {ips:,})",
            "config": {"model.dtype": dtype, "global_batch_size": batch},
            "reference": ips,
        }
        for (dtype, batch), ips in MEASURED.items()
    ]
    return suite(
        "configs/base.py",
        {
            "model.width": 1.0,
            "data.name": "synthetic",
            "data.image_shape": (32, 32, 3),
            "data.num_classes": 10,
            "mesh_shape": (1, 1, 1),
        },
        rows,
    )
